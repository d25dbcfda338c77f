"""``barrier``: no rank leaves before every rank has entered; a timeout names who never came."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.registry import EXAMPLE_KINDS

if TYPE_CHECKING:
    from plait.conformance.cases import Case
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = [
    "BARRIER",
    "BARRIER_TIMEOUT",
    "GRID_LATENESS_MS",
    "BarrierCase",
    "BarrierKind",
    "BarrierTimeoutCase",
    "BarrierTimeoutKind",
    "barrier_cases",
    "barrier_grid",
    "barrier_timeout_cases",
    "barrier_timeout_grid",
]


@attrs.frozen
class BarrierCase:
    """Every rank calls ``barrier(name, timeout)``; ``late_rank`` arrives ``delay_ms`` late.

    Each rank records in a store shared with the harness that it entered, and reads,
    on leaving, how many ranks had entered: a barrier that lets a rank out early is
    seen as a count below the world size.
    """

    name: str | None
    timeout: float | None
    late_rank: int
    delay_ms: int


@attrs.frozen
class BarrierTimeoutCase:
    """Every rank but ``absent_rank`` calls ``barrier(timeout=timeout)``, which must time out."""

    absent_rank: int
    timeout: float


@functools.cache
def barrier_cases(world_size: int) -> st.SearchStrategy[BarrierCase]:
    """A barrier, named or not, with or without a timeout, one rank arriving late."""
    return st.builds(
        BarrierCase,
        name=st.none() | st.text("abcdefghijklmnopqrstuvwxyz-_0123456789", max_size=12),
        timeout=st.none() | st.floats(30, 120),
        late_rank=st.integers(0, world_size - 1),
        delay_ms=st.integers(1, 5),
    )


@functools.cache
def barrier_timeout_cases(world_size: int) -> st.SearchStrategy[BarrierTimeoutCase]:
    """One rank stays away from a barrier the others enter with a short timeout."""
    return st.builds(
        BarrierTimeoutCase,
        absent_rank=st.integers(0, world_size - 1),
        timeout=st.floats(0.05, 0.5),
    )


GRID_LATENESS_MS: Final = 50
"""How late the grid's late rank arrives at a barrier.

A barrier that lets ranks out early is seen only where the others read the count
before the late rank adds itself: the drawn lateness (1 to 5 ms) is within what a
loaded machine's scheduling can hide (the store's server answering both ranks'
entries before either's read), so the grid's examples, which every run tries, come
ten times later than the latest drawn one: late enough that a loaded machine's
scheduling does not hide it.
"""


def barrier_grid(world_size: int) -> list[Case]:
    """Each rank in turn arrives late, named and not, with and without a timeout."""
    return [
        BarrierCase(
            "stage" if rank % 2 else None, 60.0 if rank % 2 else None, rank, GRID_LATENESS_MS
        )
        for rank in range(world_size)
    ]


def barrier_timeout_grid(world_size: int) -> list[Case]:
    """The first rank absent, and the last: each example restarts the ranks."""
    absent = sorted({0, world_size - 1})
    return [BarrierTimeoutCase(rank, 0.2) for rank in absent]


BARRIER: Final = Property(
    "barrier",
    "no rank leaves barrier() before every rank has entered it (seen through a store "
    "each rank writes to on entering and reads on leaving)",
    barrier_cases,
    grid=barrier_grid,
)

BARRIER_TIMEOUT: Final = Property(
    "barrier_timeout",
    "barrier(timeout=s) raises CollectiveTimeoutError naming the rank that never came",
    barrier_timeout_cases,
    grid=barrier_timeout_grid,
    min_world_size=2,
    restarts_pool=True,
    max_examples=1,
)


def _key(context: RankContext) -> str:
    return f"barrier/{context.key}"


class BarrierKind(CollectiveKind[BarrierCase]):
    """Every rank calls ``barrier(name, timeout)``; one comes late.

    Each rank records in the evidence store that it entered, and reads on leaving how
    many ranks had: a barrier that lets a rank out early shows a count below the
    world size.
    """

    case_type = BarrierCase
    properties = (BARRIER,)

    @override
    def call(self, context: RankContext, case: BarrierCase, argument: object) -> object:
        if context.rank == case.late_rank:
            time.sleep(case.delay_ms / 1000)  # the drawn late arrival, not a wait
        context.evidence.add(_key(context), 1)
        context.strategy.barrier(case.name, timeout=case.timeout, group=context.dimension)
        return None

    @override
    def entered(self, context: RankContext, case: BarrierCase) -> int | None:
        return context.evidence.add(_key(context), 0)

    @override
    def judge(
        self, case: BarrierCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        size = len(outcomes)
        return [
            f"rank {outcome.rank} left the barrier when only {outcome.entered} of {size} "
            f"ranks had entered (rank {case.late_rank} came {case.delay_ms} ms late)"
            for outcome in outcomes
            if outcome.entered != size
        ]


class BarrierTimeoutKind(CollectiveKind[BarrierTimeoutCase]):
    """Every rank but the absent one calls ``barrier(timeout=...)``, which must time out."""

    case_type = BarrierTimeoutCase
    properties = (BARRIER_TIMEOUT,)
    raises = True

    @override
    def idle_places(self, case: BarrierTimeoutCase) -> frozenset[int]:
        return frozenset({case.absent_rank})

    @override
    def call(self, context: RankContext, case: BarrierTimeoutCase, argument: object) -> object:
        context.strategy.barrier(timeout=case.timeout, group=context.dimension)
        return None

    @override
    def judge(
        self, case: BarrierTimeoutCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        problems = []
        for outcome in outcomes:
            if outcome.rank == case.absent_rank:
                continue
            error = outcome.error
            if error is None or "CollectiveTimeoutError" not in error.kinds:
                problems.append(
                    f"rank {outcome.rank}: barrier(timeout={case.timeout}) without rank "
                    f"{case.absent_rank} must raise CollectiveTimeoutError, got "
                    f"{error.describe() if error else repr(outcome.result)}"
                )
            elif case.absent_rank not in (error.missing_ranks or ()):
                problems.append(
                    f"rank {outcome.rank}: the timeout names missing ranks "
                    f"{error.missing_ranks}, not rank {case.absent_rank}"
                )
        return problems


EXAMPLE_KINDS.register(BarrierKind())
EXAMPLE_KINDS.register(BarrierTimeoutKind())
