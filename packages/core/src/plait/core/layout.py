"""Frozen descriptions of how processes are laid out over nodes and devices."""

from __future__ import annotations

from collections.abc import Iterator

import attrs
from typing_extensions import Self

from plait.core.errors import ConfigurationError

__all__ = ["ProcessLayout", "RankInfo"]


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
class ProcessLayout:
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
