"""The examples' models parallelizing themselves over a strategy's mesh, as a user's module does.

A strategy that declares ``parallelized_by_module`` (`plait.core.TrainingSemantics`)
never wraps a module itself: the module splits its layers over the mesh's ``"tp"``
dimension and shards itself over the data-parallel ranks before ``setup_module``,
as a user's ``configure_model`` would. Each of the kit's models has a plan of its own:
the MLP's two layers column- then row-wise, the embedding's table by its columns and
the head by its rows, the transformer block's feed-forward layers; the others only
shard. Every model is then ``fully_shard``-ed over ``data_parallel_mesh``.

Where the strategy spreads stages over pipeline ranks (`plait.core.SupportsPipeline`,
``pipeline_parallel_size > 1``), the MLP and the convolution are cut into stages by
their layers (`plait.conformance.training.models.STAGED`) and each stage the rank
holds is sharded as the whole model would be (without a tensor-parallel plan: the
MLP's two layers fall in different stages); the schedule runs each window's forward
and backward, its loss divided by the window's micro-batches.

Where the strategy splits sequences over context-parallel ranks
(`plait.core.SupportsContextParallel` with a ``cp`` group, and
`plait.core.SupportsContextParallelAttention`), the attention model takes its tokens
of each sequence (``shard_sequence``), attends through the strategy's ``attention``
and adds its pooled sum up over the ``cp`` group; the other models read their
samples whole on every ``cp`` rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from plait.conformance.training.models import STAGED, Attention
from plait.core import (
    SupportsContextParallel,
    SupportsContextParallelAttention,
    SupportsDeviceMesh,
    SupportsPipeline,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

    from plait.conformance.training.cases import TrainingRun
    from plait.core import Strategy

__all__ = [
    "SupportsDataParallelMesh",
    "Unstaged",
    "parallelize",
    "pipelined",
    "split_sequences",
    "stages_of",
    "tensor_parallel_plan",
]


class Unstaged(Exception):  # noqa: N818 - a refusal, as the loop's Refused
    """The run's model cannot be cut into stages for the strategy's pipeline."""


@runtime_checkable
class _Staged(Protocol):
    """A pipeline stage module as `plait.core.SupportsPipeline.pipeline` gives it."""

    parts: torch.nn.ModuleList


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
    return {}  # the others' layers stay whole: they are only sharded


def split_sequences(model: nn.Module, strategy: Strategy) -> bool:
    """Have ``model`` attend over sequences split between ``cp`` ranks, where they are.

    Returns:
        Whether the loop gives the model its tokens of each sequence alone.
    """
    if not (
        isinstance(model, Attention)
        and isinstance(strategy, SupportsContextParallel)
        and isinstance(strategy, SupportsContextParallelAttention)
    ):
        return False
    group = strategy.context_parallel_group
    if group is None:
        return False
    model.attend = strategy.attention
    model.group = group
    return True


def pipelined(strategy: Strategy) -> bool:
    """Whether ``strategy`` spreads a module's stages over pipeline ranks."""
    return isinstance(strategy, SupportsPipeline) and strategy.pipeline_parallel_size > 1


def stages_of(
    model: nn.Module,
    run: TrainingRun,
    strategy: Strategy,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> nn.Module:
    """This rank's stages of ``model``, each parallelized: the module the loop trains.

    Raises:
        Unstaged: The model has no stages (an embedding bag, a transformer block, a
            norm whose statistics a microbatch would change), or its micro-batches
            do not split into the schedule's microbatches.
    """
    assert isinstance(strategy, SupportsPipeline)
    units = STAGED.get(run.model)
    if units is None:
        raise Unstaged(
            f"the {run.model} model is not cut into pipeline stages: the kit's "
            f"{' and '.join(STAGED)} are"
        )
    stage = strategy.pipeline(model, loss_fn, units=units)
    microbatches = getattr(stage, "microbatches", 1)
    if isinstance(microbatches, int) and run.micro_batch % microbatches:
        raise Unstaged(
            f"a micro-batch of {run.micro_batch} does not split into the schedule's "
            f"{microbatches} microbatches"
        )
    parts = list(stage.parts) if isinstance(stage, _Staged) else [stage]
    for part in parts:
        parallelize(part, run, strategy, plan=False)
    return stage


def parallelize(
    model: nn.Module, run: TrainingRun, strategy: Strategy, *, plan: bool = True
) -> None:
    """Parallelize ``model`` over ``strategy``'s mesh in place, as a user's module does.

    ``plan``: split its layers over ``"tp"`` too (a pipeline's stages do not).

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
    layers = tensor_parallel_plan(run) if plan else {}
    if "tp" in names and layers:
        parallelize_module(model, mesh["tp"], layers)
    fully_shard(model, mesh=strategy.data_parallel_mesh)
