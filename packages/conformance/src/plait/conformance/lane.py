"""A lane of the conformance suite, and the rank pools a session keeps for its lanes.

A `Lane` is one group of the suite's tests (a strategy, a backend, a world size, a
mesh); `PoolCache` keeps a few lanes' ranks alive across their tests. The pytest
plugin (`plait.conformance.plugin`) makes both; the suite's tests
(`plait.conformance.suite`) take them as fixtures. Both stand on this module, and
neither on the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from plait.conformance.mesh import mesh_text
from plait.conformance.pool import PoolStartError, RankPool

if TYPE_CHECKING:
    from plait.conformance.target import StrategyTarget

__all__ = ["Lane", "LaneDown", "PoolCache"]


class LaneDown(Exception):  # noqa: N818 - a skip's reason, not an error of its own
    """A lane's ranks could not start; its first test failed saying why."""


@attrs.frozen
class Lane:
    """One group of the suite's tests: a strategy, a backend, a world size and a mesh.

    With a mesh (the target's), the strategy is built on it and every property runs
    over the whole job and over each dimension's groups.
    """

    target: StrategyTarget
    backend: str
    world_size: int
    deadline: float
    start_timeout: float = 120.0

    def describe(self) -> dict[str, object]:
        """The lane as plain data, for reports."""
        return {
            "id": self.id,
            "strategy": self.target.spec,
            "backend": self.backend,
            "world_size": self.world_size,
            **({"mesh": list(self.target.mesh)} if self.target.mesh else {}),
        }

    @property
    def id(self) -> str:
        """``strategy-backend-world_size`` (``-mesh``, e.g. ``-2x2``), as pytest shows it."""
        return self._named(self.target.name)

    @property
    def names(self) -> tuple[str, ...]:
        """The lane's id, and the same with the strategy written as it was given."""
        given = self._named(self.target.spec)
        return (self.id,) if given == self.id else (self.id, given)

    def _named(self, strategy: str) -> str:
        mesh = f"-{mesh_text(self.target.mesh)}" if self.target.mesh else ""
        return f"{strategy}-{self.backend}-{self.world_size}{mesh}"


class PoolCache:
    """The live rank pools of a session: a few at a time, closed when evicted.

    Args:
        size: How many pools may be up at once; each holds ``world_size`` processes.
    """

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._pools: dict[Lane, RankPool] = {}
        self._failed: dict[Lane, str] = {}
        self.starts: dict[Lane, int] = {}
        """How many times each lane's ranks were started in this process."""
        self.failed: dict[Lane, list[str]] = {}
        """Per lane, the properties that failed on it so far, in order."""

    def get(self, lane: Lane, test: str = "") -> RankPool:
        """The pool of ``lane``, started (an older one is closed to make room).

        Raises:
            PoolStartError: The ranks could not start, the first time for the lane.
            LaneDown: They could not start before: the first error said why.
        """
        first = self._failed.get(lane)
        if first is not None:
            raise LaneDown(f"the ranks of {lane.id} could not start: see the error of {first}")
        pool = self._pools.pop(lane, None)
        if pool is None:
            while len(self._pools) >= self.size:
                oldest = next(iter(self._pools))
                self._pools.pop(oldest).close()
            pool = RankPool(
                lane.target,
                world_size=lane.world_size,
                backend=lane.backend,
                deadline=lane.deadline,
                start_timeout=lane.start_timeout,
                mesh=lane.target.mesh,
            )
        self._pools[lane] = pool  # most recently used last
        if not pool.running:
            self.starts[lane] = self.starts.get(lane, 0) + 1
        try:
            pool.start()
        except PoolStartError:
            self._pools.pop(lane).close()
            self._failed[lane] = test or lane.id
            raise
        return pool

    def close(self) -> None:
        """Close every pool."""
        while self._pools:
            self._pools.popitem()[1].close()
