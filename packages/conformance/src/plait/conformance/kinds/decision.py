"""``reduce_boolean_decision``: the logical all (or any) of every rank's vote."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from plait.conformance.cases import DecisionCase
from plait.conformance.spec import _check_case
from plait.conformance.worker import _Context, invoke

if TYPE_CHECKING:
    from plait.conformance.outcomes import Outcome

__all__: list[str] = []


@invoke.register(DecisionCase)
def _invoke_decision(
    case: DecisionCase, context: _Context, argument: object
) -> tuple[object, None]:
    strategy = context.strategy
    return strategy.reduce_boolean_decision(case.decisions[context.rank], all=case.all), None


@_check_case.register(DecisionCase)
def _check_decision(
    case: DecisionCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    want = all(case.decisions) if case.all else any(case.decisions)
    return [
        f"rank {outcome.rank}: got {outcome.result!r}, expected {want} "
        f"({'all' if case.all else 'any'} of {list(case.decisions)})"
        for outcome in outcomes
        if outcome.result is not want
    ]
