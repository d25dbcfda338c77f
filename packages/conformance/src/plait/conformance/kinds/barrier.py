"""``barrier``: no rank leaves before every rank has entered; a timeout names who never came."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from plait.conformance.cases import BarrierCase, BarrierTimeoutCase
from plait.conformance.spec import _check_case
from plait.conformance.worker import _Context, invoke

if TYPE_CHECKING:
    from plait.conformance.outcomes import Outcome

__all__: list[str] = []


@invoke.register(BarrierCase)
def _invoke_barrier(
    case: BarrierCase, context: _Context, argument: object
) -> tuple[object, int | None]:
    rank = context.rank
    strategy = context.strategy
    group = context.dimension
    key = f"barrier/{context.key}"
    if rank == case.late_rank:
        time.sleep(case.delay_ms / 1000)  # the drawn late arrival, not a wait
    context.evidence.add(key, 1)
    strategy.barrier(case.name, timeout=case.timeout, group=group)
    return None, context.evidence.add(key, 0)


@invoke.register(BarrierTimeoutCase)
def _invoke_barrier_timeout(
    case: BarrierTimeoutCase, context: _Context, argument: object
) -> tuple[object, None]:
    strategy = context.strategy
    group = context.dimension
    strategy.barrier(timeout=case.timeout, group=group)
    return None, None


@_check_case.register(BarrierCase)
def _check_barrier(
    case: BarrierCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    size = len(outcomes)
    return [
        f"rank {outcome.rank} left the barrier when only {outcome.entered} of {size} ranks "
        f"had entered (rank {case.late_rank} came {case.delay_ms} ms late)"
        for outcome in outcomes
        if outcome.entered != size
    ]


@_check_case.register(BarrierTimeoutCase)
def _check_barrier_timeout(
    case: BarrierTimeoutCase, outcomes: Sequence[Outcome], devices: Sequence[str]
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
                f"rank {outcome.rank}: the timeout names missing ranks {error.missing_ranks}, "
                f"not rank {case.absent_rank}"
            )
    return problems
