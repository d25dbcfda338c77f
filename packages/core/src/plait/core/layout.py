"""Frozen descriptions of how processes are laid out over nodes and devices."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType

import attrs
from typing_extensions import Self

from plait.core.errors import ConfigurationError

__all__ = ["NodeLayout", "ProcessLayout", "RankInfo"]


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ConfigurationError(
            f"{type(instance).__name__}.{attribute.name} must be at least 1, got {value}",
            value=value,
        )


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ConfigurationError(
            f"{type(instance).__name__}.{attribute.name} must be 0 or more, got {value}",
            value=value,
        )


def _int(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    # bool is an int to Python, but `num_nodes=True` is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be an int, "
            f"got {value!r} of type {type(value).__name__}"
        )


@attrs.frozen
class NodeLayout:
    """How many nodes take part, and how many processes each runs.

    Attributes:
        num_nodes: Machines in the job.
        processes_per_node: Processes started on each machine (one per device).
    """

    num_nodes: int = attrs.field(validator=[_int, _positive])
    processes_per_node: int = attrs.field(validator=[_int, _positive])

    @property
    def world_size(self) -> int:
        """The number of processes in the whole job."""
        return self.num_nodes * self.processes_per_node

    def rank(self, *, node_rank: int, local_rank: int) -> RankInfo:
        """Describe the process at ``local_rank`` on node ``node_rank``."""
        return RankInfo(
            global_rank=node_rank * self.processes_per_node + local_rank,
            local_rank=local_rank,
            node_rank=node_rank,
            world_size=self.world_size,
            local_world_size=self.processes_per_node,
        )

    def ranks(self) -> Iterator[RankInfo]:
        """Every process of the layout, in global rank order."""
        for node_rank in range(self.num_nodes):
            for local_rank in range(self.processes_per_node):
                yield self.rank(node_rank=node_rank, local_rank=local_rank)


@attrs.frozen
class RankInfo:
    """Where one process sits in the job.

    Attributes:
        global_rank: Its rank among all processes, in ``[0, world_size)``.
        local_rank: Its rank among the processes of its node.
        node_rank: The rank of its node.
        world_size: The number of processes in the job.
        local_world_size: The number of processes on its node.
    """

    global_rank: int = attrs.field(validator=[_int, _non_negative])
    local_rank: int = attrs.field(validator=[_int, _non_negative])
    node_rank: int = attrs.field(validator=[_int, _non_negative])
    world_size: int = attrs.field(validator=[_int, _positive])
    local_world_size: int = attrs.field(validator=[_int, _positive])

    def __attrs_post_init__(self) -> None:
        if self.global_rank >= self.world_size:
            raise ConfigurationError(
                f"global_rank {self.global_rank} is outside the world "
                f"[0, {self.world_size}): ranks count from 0",
                value=self.global_rank,
            )
        if self.local_rank >= self.local_world_size:
            raise ConfigurationError(
                f"local_rank {self.local_rank} is outside its node "
                f"[0, {self.local_world_size}): local ranks count from 0",
                value=self.local_rank,
            )
        if self.local_world_size > self.world_size:
            raise ConfigurationError(
                f"local_world_size {self.local_world_size} exceeds world_size {self.world_size}",
                value=self.local_world_size,
            )

    @property
    def is_global_zero(self) -> bool:
        """Whether this is the process of global rank 0."""
        return self.global_rank == 0

    @classmethod
    def single_process(cls) -> Self:
        """The layout of a job that runs in one process."""
        return cls(global_rank=0, local_rank=0, node_rank=0, world_size=1, local_world_size=1)


def _dimensions(
    instance: ProcessLayout, attribute: attrs.Attribute[Mapping[str, int]], value: object
) -> None:
    if not isinstance(value, Mapping):
        raise TypeError(
            f"ProcessLayout.dimensions must be a mapping of names to sizes, got {value!r}"
        )
    for name, size in value.items():
        if not isinstance(name, str) or isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(
                f"ProcessLayout.dimensions maps names to int sizes; got {name!r}: {size!r}"
            )
        if size < 1:
            raise ConfigurationError(
                f"the mesh dimension {name!r} has size {size}; sizes are at least 1",
                value=size,
            )
        if name == "data_parallel":
            raise ConfigurationError(
                "'data_parallel' is given by data_parallel_size, not among the other dimensions",
                value=name,
                fix="pass data_parallel_size=..., and name only the other dimensions",
            )


def _frozen_dimensions(value: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(value))


@attrs.frozen
class ProcessLayout:
    """Where this process sits in the job, as a strategy lays the job out.

    Data is sharded by the data-parallel rank and size: under plain data
    parallelism they are the global rank and world size; under tensor, pipeline or
    hybrid-sharded layouts the ranks that hold the same data share a data-parallel
    rank. The other mesh dimensions (``{"tp": 2}``, ...) are named in
    ``dimensions``; the data-parallel size times their sizes is the world size, and
    ``coordinates`` holds this process's index along each of them.

    Attributes:
        world_size: The number of processes in the job.
        global_rank: This process's rank among them.
        data_parallel_size: The number of distinct shards of the data.
        data_parallel_rank: The shard of the data this process reads.
        dimensions: The other mesh dimensions, by name, with their sizes.
        coordinates: This process's index along each of ``dimensions`` (0 for a
            dimension left out).

    Raises:
        ConfigurationError: A rank outside its range, dimensions whose sizes do not
            multiply to the world size, or a coordinate of no dimension or outside it.
    """

    world_size: int = attrs.field(validator=[_int, _positive])
    global_rank: int = attrs.field(validator=[_int, _non_negative])
    data_parallel_size: int = attrs.field(
        default=attrs.Factory(lambda self: self.world_size, takes_self=True),
        validator=[_int, _positive],
    )
    data_parallel_rank: int = attrs.field(
        default=attrs.Factory(
            lambda self: self.global_rank if self.data_parallel_size == self.world_size else 0,
            takes_self=True,
        ),
        validator=[_int, _non_negative],
    )
    dimensions: Mapping[str, int] = attrs.field(
        factory=dict, validator=_dimensions, converter=_frozen_dimensions
    )
    coordinates: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen_dimensions)

    def __attrs_post_init__(self) -> None:
        if self.global_rank >= self.world_size:
            raise ConfigurationError(
                f"global_rank {self.global_rank} is outside the world [0, {self.world_size})",
                value=self.global_rank,
            )
        if self.data_parallel_rank >= self.data_parallel_size:
            raise ConfigurationError(
                f"data_parallel_rank {self.data_parallel_rank} is outside "
                f"[0, {self.data_parallel_size})",
                value=self.data_parallel_rank,
            )
        product = self.data_parallel_size
        for size in self.dimensions.values():
            product *= size
        if product != self.world_size:
            sizes = " x ".join(
                [f"data_parallel={self.data_parallel_size}"]
                + [f"{name}={size}" for name, size in self.dimensions.items()]
            )
            raise ConfigurationError(
                f"the layout's dimensions ({sizes}) hold {product} processes, and the world "
                f"has {self.world_size}",
                value=dict(self.dimensions),
                fix="make the data-parallel size times the other dimensions' sizes equal "
                "the world size",
            )
        self._check_coordinates()

    def _check_coordinates(self) -> None:
        for name, index in self.coordinates.items():
            size = self.dimensions.get(name)
            if size is None:
                raise ConfigurationError(
                    f"the coordinate {name!r} names no dimension of the layout",
                    value=name,
                    choices=list(self.dimensions),
                    fix="give a coordinate only along a dimension named in dimensions",
                )
            given: object = index  # an int by its annotation only: checked
            if isinstance(given, bool) or not isinstance(given, int) or not 0 <= given < size:
                raise ConfigurationError(
                    f"the coordinate {name}={index!r} is outside the dimension [0, {size})",
                    value=index,
                )

    @classmethod
    def single_process(cls) -> Self:
        """The layout of a job that runs in one process."""
        return cls(world_size=1, global_rank=0)

    def size_of(self, dimension: str) -> int:
        """The size of the mesh dimension ``dimension`` (1 where the layout has none)."""
        return self.dimensions.get(dimension, 1)

    def rank_in(self, dimension: str) -> int:
        """This process's index along ``dimension`` (0 where the layout has none)."""
        return self.coordinates.get(dimension, 0)

    @property
    def tensor_parallel_size(self) -> int:
        """The ranks a tensor-parallel group splits each layer over (1: none)."""
        return self.size_of("tp")

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's rank in its tensor-parallel group."""
        return self.rank_in("tp")

    @property
    def is_global_zero(self) -> bool:
        """Whether this is the process of global rank 0."""
        return self.global_rank == 0
