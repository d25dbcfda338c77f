"""The mesh plan: the sizes asked for, checked once, and the one pure function that lays them out.

`MeshSizes` holds what a user asks of `ModelParallelStrategy` (``"auto"`` allowed
for the data- and tensor-parallel sizes), checked when it is made; `MeshSizes.resolve`
gives the `MeshShape` of a world of so many ranks on so many nodes, or the error
that names the sizes that do not make it. Nothing here reads the environment or
joins a process group: the strategy resolves its sizes once, when it joins its job.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Literal, Protocol

import attrs
import torch
from typing_extensions import override

from plait.core import ConfigurationError

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = [
    "FLATTENED_DIMENSIONS",
    "MESH_DIMENSIONS",
    "MeshDim",
    "MeshHost",
    "MeshShape",
    "MeshSizes",
    "Size",
    "check_size",
]


class MeshDim(enum.StrEnum):
    """A dimension of the mesh, or a group flattened over several, by the name it goes by.

    Each member is its name (``MeshDim.TENSOR == "tp"``): collectives' ``group=``,
    ``device_mesh[...]`` and the layout's dimensions take either. Adding a dimension
    starts here, with a rule in `MeshSizes.resolve`.
    """

    PIPELINE = "pp"
    REPLICATE = "dp_replicate"
    SHARD = "dp_shard"
    CONTEXT = "cp"
    TENSOR = "tp"
    DATA = "dp"
    """``dp_replicate`` and ``dp_shard`` flattened: the ranks that read different data."""
    SHARD_CONTEXT = "dp_shard_cp"
    """``dp_shard`` and ``cp`` flattened: what FSDP shards over with context parallelism."""
    DATA_CONTEXT = "dp_cp"
    """``dp`` and ``cp`` flattened: where a loss over every token of a step is averaged."""

    @override
    def __repr__(self) -> str:
        # Shown as the name it goes by, in lists and messages: ['dp_shard'].
        return repr(self.value)


MESH_DIMENSIONS: Final = (
    MeshDim.PIPELINE,
    MeshDim.REPLICATE,
    MeshDim.SHARD,
    MeshDim.CONTEXT,
    MeshDim.TENSOR,
)
"""The mesh's dimensions, outermost first: pipeline stages (only neighbours exchange
activations, so they may sit on different nodes), data-parallel replicas,
data-parallel shards within a replica, context-parallel ranks (each a slice of every
sequence) and tensor-parallel ranks (innermost: neighbouring ranks, which share a
node's fastest links; context parallelism, an all-gather in every attention layer,
beside them). The device mesh has ``pp`` and ``cp`` only when they are more than 1
(`MeshShape.mesh_dimensions`)."""

FLATTENED_DIMENSIONS: Final = {
    MeshDim.DATA: (MeshDim.REPLICATE, MeshDim.SHARD),
    MeshDim.SHARD_CONTEXT: (MeshDim.SHARD, MeshDim.CONTEXT),
    MeshDim.DATA_CONTEXT: (MeshDim.REPLICATE, MeshDim.SHARD, MeshDim.CONTEXT),
}
"""Groups over several dimensions at once, by name: ``dp`` (the ranks that read
different data), ``dp_shard_cp`` (what FSDP shards over: the context-parallel ranks'
gradients of the same parameters are summed there) and ``dp_cp`` (where a loss or a
metric over every token of a step is averaged)."""

Size = int | Literal["auto"]


def check_size(name: str, value: object) -> Size:
    """``value`` if it is a positive int or ``"auto"``.

    Raises:
        ConfigurationError: It is neither, naming ``name``.
    """
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ConfigurationError(
        f"{name}={value!r} is neither a positive int nor 'auto'",
        value=value,
        fix=f"pass {name}=2 (say), or 'auto' to take what the world leaves",
    )


def _check_count(name: str, value: object, fix: str) -> int:
    size = check_size(name, value)
    if size == "auto":
        raise ConfigurationError(
            f"{name} takes a positive int, not 'auto'", value=size, fix=f"pass {fix}"
        )
    return size


@attrs.frozen
class MeshShape:
    """The sizes of the mesh's dimensions, and this rank's place along each.

    Ranks are laid out row-major over (``pp``, ``dp_replicate``, ``dp_shard``,
    ``cp``, ``tp``): the ranks of one tensor-parallel group are neighbours, and with
    ``pipeline=1`` and ``context=1`` the numbering is the same as over
    (``dp_replicate``, ``dp_shard``, ``tp``).

    Attributes:
        replicate: Data-parallel replicas (``dp_replicate``).
        shard: Data-parallel shards within a replica (``dp_shard``).
        tensor: Tensor-parallel ranks (``tp``).
        context: Context-parallel ranks (``cp``): each holds a slice of every sequence.
        pipeline: Pipeline ranks (``pp``): each holds its stages of the model.
    """

    replicate: int
    shard: int
    tensor: int
    context: int = 1
    pipeline: int = 1

    @property
    def sizes(self) -> dict[str, int]:
        """The size of each of `MESH_DIMENSIONS`, in order, keyed by `MeshDim` (or its name)."""
        return {
            MeshDim.PIPELINE: self.pipeline,
            MeshDim.REPLICATE: self.replicate,
            MeshDim.SHARD: self.shard,
            MeshDim.CONTEXT: self.context,
            MeshDim.TENSOR: self.tensor,
        }

    @property
    def mesh_dimensions(self) -> tuple[MeshDim, ...]:
        """The dimensions of the device mesh: `MESH_DIMENSIONS`, less ``pp`` and ``cp`` at 1.

        Without pipeline or context parallelism the mesh is (``dp_replicate``,
        ``dp_shard``, ``tp``), as it always was; the collectives know ``"pp"`` and
        ``"cp"`` either way.
        """
        optional = {MeshDim.PIPELINE: self.pipeline, MeshDim.CONTEXT: self.context}
        return tuple(name for name in MESH_DIMENSIONS if optional.get(name, 2) > 1)

    @property
    def data_parallel(self) -> int:
        """The distinct shards of the data: replicas times shards."""
        return self.replicate * self.shard

    @property
    def world_size(self) -> int:
        """The ranks the mesh holds."""
        return self.pipeline * self.data_parallel * self.context * self.tensor

    def ranks(self) -> torch.Tensor:
        """The global ranks, shaped (``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``)."""
        # On the CPU whatever the default device (the meta one, inside
        # model_sharded_context): these are numbers, not a model's tensors.
        return torch.arange(self.world_size, device="cpu").view(
            self.pipeline, self.replicate, self.shard, self.context, self.tensor
        )

    def enabled(self, dimension: MeshDim) -> bool:
        """Whether ``dimension`` spans more than one rank (a flattened one: any of its own)."""
        return any(
            self.sizes[name] > 1 for name in FLATTENED_DIMENSIONS.get(dimension, (dimension,))
        )

    def line(self, dimensions: Sequence[MeshDim], rank: int) -> list[int]:
        """The global ranks of ``rank``'s group along ``dimensions``, in their order along it."""
        rows: list[list[int]] = self.lines(dimensions).tolist()
        [mine] = [row for row in rows if rank in row]
        return mine

    def lines(self, dimensions: Sequence[MeshDim]) -> torch.Tensor:
        """Every group along ``dimensions`` (several: one flattened group), a row each.

        Row ``i`` holds the global ranks of one group, in the order of their index
        along it; every rank is in exactly one row.
        """
        axes = [MESH_DIMENSIONS.index(name) for name in dimensions]
        others = [axis for axis in range(len(MESH_DIMENSIONS)) if axis not in axes]
        size = 1
        for name in dimensions:
            size *= self.sizes[name]
        return self.ranks().permute(*others, *axes).reshape(-1, size)

    def coordinates(self, rank: int) -> dict[str, int]:
        """``rank``'s index along each dimension and each flattened one, keyed by `MeshDim`."""
        rest, tensor = divmod(rank, self.tensor)
        rest, context = divmod(rest, self.context)
        pipeline, data_parallel = divmod(rest, self.data_parallel)
        replicate, shard = divmod(data_parallel, self.shard)
        return {
            MeshDim.PIPELINE: pipeline,
            MeshDim.REPLICATE: replicate,
            MeshDim.SHARD: shard,
            MeshDim.CONTEXT: context,
            MeshDim.TENSOR: tensor,
            MeshDim.DATA: data_parallel,
            MeshDim.SHARD_CONTEXT: shard * self.context + context,
            MeshDim.DATA_CONTEXT: data_parallel * self.context + context,
        }


@attrs.frozen
class MeshSizes:
    """The mesh's sizes as asked, each checked when this is made: `ModelParallelStrategy`'s.

    Attributes:
        data_parallel_size: Ranks that read different data; ``"auto"``: what the
            tensor-parallel size leaves (with both ``"auto"``: the number of nodes).
        tensor_parallel_size: Ranks each layer is split over; ``"auto"``: what the
            data-parallel size leaves (with both ``"auto"``: a node's processes).
        data_parallel_replicate_size: Of the data-parallel ranks, how many replicas.
        context_parallel_size: Ranks each sequence is split over.
        pipeline_parallel_size: Ranks the model's stages are spread over.

    Raises:
        ConfigurationError: A size that is neither a positive int nor ``"auto"``,
            ``"auto"`` where a count is needed, or a replica count that does not
            divide the data-parallel size.
    """

    data_parallel_size: Size = "auto"
    tensor_parallel_size: Size = "auto"
    data_parallel_replicate_size: int = 1
    context_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    def __attrs_post_init__(self) -> None:
        data = check_size("data_parallel_size", self.data_parallel_size)
        check_size("tensor_parallel_size", self.tensor_parallel_size)
        replicate = _check_count(
            "data_parallel_replicate_size",
            self.data_parallel_replicate_size,
            "data_parallel_replicate_size=1 (pure sharding), or the replicas",
        )
        if isinstance(data, int) and data % replicate:
            raise ConfigurationError(
                f"data_parallel_replicate_size={replicate} does not divide "
                f"data_parallel_size={data}: each replica is sharded "
                "over as many ranks as the others",
                value=replicate,
                fix="pass a replica count that divides data_parallel_size",
            )
        _check_count(
            "context_parallel_size",
            self.context_parallel_size,
            "context_parallel_size=1 (no context parallelism), or the ranks each sequence "
            "is split over",
        )
        _check_count(
            "pipeline_parallel_size",
            self.pipeline_parallel_size,
            "pipeline_parallel_size=1 (no pipeline), or the ranks the model's stages are "
            "spread over",
        )

    def resolve(self, world_size: int, num_nodes: int = 1) -> MeshShape:
        """The mesh of a world of ``world_size`` ranks on ``num_nodes`` nodes.

        Raises:
            ConfigurationError: The sizes do not make the world: a size that does not
                divide it, or a product that is not it.
        """
        world = world_size
        data, tensor = self.data_parallel_size, self.tensor_parallel_size
        context, pipeline = self.context_parallel_size, self.pipeline_parallel_size
        for name, size in (("pipeline", pipeline), ("context", context)):
            if world % size:
                raise ConfigurationError(
                    f"{name}_parallel_size={size} does not divide the world of {world} ranks",
                    value=size,
                    fix=f"pass a {name}_parallel_size that divides {world}",
                )
        if world % (context * pipeline):
            raise ConfigurationError(
                f"pipeline_parallel_size={pipeline} x context_parallel_size={context} "
                f"does not divide the world of {world} ranks",
                value=(pipeline, context),
                fix=f"pass sizes whose product divides {world}",
            )
        # What the data- and tensor-parallel sizes share: the world less pp and cp.
        shared = world // (context * pipeline)
        if data == "auto" and tensor == "auto":
            data = num_nodes if shared % num_nodes == 0 else 1
        if tensor == "auto":
            assert isinstance(data, int)
            tensor = self._leaves("tensor_parallel_size", "data_parallel_size", data, shared)
        elif data == "auto":
            data = self._leaves("data_parallel_size", "tensor_parallel_size", tensor, shared)
        if pipeline * data * context * tensor != world:
            with_pipeline = f"pipeline_parallel_size={pipeline} x " if pipeline > 1 else ""
            with_context = f" x context_parallel_size={context}" if context > 1 else ""
            given = {
                MeshDim.PIPELINE: pipeline,
                MeshDim.DATA: data,
                MeshDim.CONTEXT: context,
                MeshDim.TENSOR: tensor,
            }
            raise ConfigurationError(
                f"{with_pipeline}data_parallel_size={data}{with_context} x "
                f"tensor_parallel_size={tensor} is {pipeline * data * context * tensor} "
                f"ranks, and the world has {world}",
                value=tuple(
                    size
                    for name, size in given.items()
                    if name in (MeshDim.DATA, MeshDim.TENSOR) or size > 1
                ),
                fix=f"give sizes whose product is {world}, or leave one 'auto'",
            )
        replicate = self.data_parallel_replicate_size
        if data % replicate:
            raise ConfigurationError(
                f"data_parallel_replicate_size={replicate} does not divide the "
                f"data-parallel size {data}",
                value=replicate,
                fix=f"pass a replica count that divides {data}",
            )
        return MeshShape(
            replicate=replicate,
            shard=data // replicate,
            tensor=tensor,
            context=context,
            pipeline=pipeline,
        )

    def _leaves(self, name: str, given_name: str, given: int, shared: int) -> int:
        if shared % given:
            taken = " x ".join(
                f"{name}_parallel_size of {size}"
                for name, size in (
                    ("a pipeline", self.pipeline_parallel_size),
                    ("a context", self.context_parallel_size),
                )
                if size > 1
            )
            world = (
                f"the {shared} ranks {taken} leaves" if taken else f"the world of {shared} ranks"
            )
            raise ConfigurationError(
                f"{given_name}={given} does not divide {world}, so {name}='auto' has no "
                "size to take",
                value=given,
                fix=f"pass a {given_name} that divides {shared}",
            )
        return shared // given


class MeshHost(Protocol):
    """What a parallelism's part needs of the strategy it is part of: the job's mesh."""

    @property
    def mesh_shape(self) -> MeshShape:
        """The mesh, resolved once when the strategy joined its job."""
        ...

    @property
    def global_rank(self) -> int:
        """This rank's index in the job."""
        ...

    @property
    def root_device(self) -> torch.device:
        """The device this rank computes on."""
        ...

    def mesh_group(self, dimension: MeshDim) -> dist.ProcessGroup | None:
        """This rank's group along ``dimension`` (``None``: the whole job).

        Raises:
            ConfigurationError: The strategy has not joined its job yet.
        """
        ...
