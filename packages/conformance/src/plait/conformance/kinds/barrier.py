"""``barrier``: no rank leaves before every rank has entered; a timeout names who never came."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from typing_extensions import override

from plait.conformance import generate, grid
from plait.conformance.cases import BarrierCase, BarrierTimeoutCase
from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.registry import EXAMPLE_KINDS

if TYPE_CHECKING:
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = ["BARRIER", "BARRIER_TIMEOUT", "BarrierKind", "BarrierTimeoutKind"]

BARRIER: Final = Property(
    "barrier",
    "no rank leaves barrier() before every rank has entered it (seen through a store "
    "each rank writes to on entering and reads on leaving)",
    generate.barrier_cases,
    grid=grid.barrier,
)

BARRIER_TIMEOUT: Final = Property(
    "barrier_timeout",
    "barrier(timeout=s) raises CollectiveTimeoutError naming the rank that never came",
    generate.barrier_timeout_cases,
    grid=grid.barrier_timeout,
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
    snippet_names = ("Call", "TensorSpec")

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
    snippet_names = ("Call", "TensorSpec")

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
