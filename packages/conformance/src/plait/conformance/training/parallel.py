"""The examples' models parallelizing themselves over a strategy's mesh, as a user's module does.

A strategy that declares ``parallelized_by_module`` (`plait.core.TrainingSemantics`)
never wraps a module itself: the module splits its layers over the mesh's ``"tp"``
dimension and shards itself over the data-parallel ranks before ``setup_module``,
as a user's ``configure_model`` would. Each of the kit's models has a plan of its own:
the MLP's two layers column- then row-wise, the embedding's table by its columns and
the head by its rows, the transformer block's feed-forward layers; the convolution
only shards. Every model is then ``fully_shard``-ed over ``data_parallel_mesh``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from plait.core import SupportsDeviceMesh

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

    from plait.conformance.training.cases import TrainingRun
    from plait.core import Strategy

__all__ = ["SupportsDataParallelMesh", "parallelize", "tensor_parallel_plan"]


@runtime_checkable
class SupportsDataParallelMesh(SupportsDeviceMesh, Protocol):
    """A strategy whose module shards itself over the data-parallel part of its mesh."""

    @property
    def data_parallel_mesh(self) -> DeviceMesh:
        """The mesh ``fully_shard`` shards the module over (every rank reads other data)."""
        ...


def tensor_parallel_plan(run: TrainingRun) -> dict[str, ParallelStyle]:
    """How the run's model splits its layers over a ``"tp"`` dimension, by submodule name."""
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
    )

    if run.model == "mlp":
        return {"0": ColwiseParallel(), "2": RowwiseParallel()}
    if run.model == "embedding":
        # The table by its columns: each rank embeds every token in its share of the
        # features, which the head's rows then sum.
        return {"embedding": ColwiseParallel(), "head": RowwiseParallel()}
    if run.model == "transformer":
        return {"block.linear1": ColwiseParallel(), "block.linear2": RowwiseParallel()}
    return {}  # a convolution's channels stay whole: it is only sharded


def parallelize(model: nn.Module, run: TrainingRun, strategy: Strategy) -> None:
    """Parallelize ``model`` over ``strategy``'s mesh in place, as a user's module does.

    Raises:
        AssertionError: The strategy declares ``parallelized_by_module`` and has no
            ``device_mesh`` or ``data_parallel_mesh`` to parallelize over.
    """
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415
    from torch.distributed.tensor.parallel import parallelize_module  # noqa: PLC0415

    if not isinstance(strategy, SupportsDataParallelMesh):
        raise AssertionError(
            f"{type(strategy).__name__} declares parallelized_by_module=True, and has no "
            "device_mesh and data_parallel_mesh for a module to parallelize itself over: "
            "give it both (plait.conformance.training.parallel.SupportsDataParallelMesh), "
            "or declare parallelized_by_module=False and wrap the module in setup_module"
        )
    mesh = strategy.device_mesh
    names = mesh.mesh_dim_names or ()
    plan = tensor_parallel_plan(run)
    if "tp" in names and plan:
        parallelize_module(model, mesh["tp"], plan)
    fully_shard(model, mesh=strategy.data_parallel_mesh)
