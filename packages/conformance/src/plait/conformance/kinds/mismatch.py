"""Mismatched calls: every rank raises `CollectiveMismatchError` naming each rank's call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from plait.conformance.cases import Call, MismatchCase
from plait.conformance.spec import _check_case, _show
from plait.conformance.worker import _Context, _src, invoke, materialize

if TYPE_CHECKING:
    from plait.conformance.outcomes import Outcome

__all__: list[str] = []


def _call(context: _Context, call: Call) -> object:
    strategy = context.strategy
    group = context.dimension
    tensor = materialize(call.tensor, context.device) if call.tensor is not None else None
    if call.collective == "reduce":
        assert tensor is not None
        return strategy.reduce(tensor, group=group, reduce_op=str(call.arg))
    if call.collective == "all_gather":
        assert tensor is not None
        return strategy.all_gather(tensor, group=group)
    if call.collective == "broadcast":
        src = _src(context, int(call.arg))  # type: ignore[call-overload]
        return strategy.broadcast(tensor, src=src, group=group)
    if call.collective == "barrier":
        strategy.barrier(None if call.arg is None else str(call.arg), group=group)
        return None
    return strategy.reduce_boolean_decision(decision=True, all=bool(call.arg))


@invoke.register(MismatchCase)
def _invoke_mismatch(
    case: MismatchCase, context: _Context, argument: object
) -> tuple[object, None]:
    return _call(context, case.calls[context.rank]), None


def _partition(pairs: Sequence[tuple[int, object]]) -> set[frozenset[int]]:
    groups: dict[object, set[int]] = {}
    for rank, key in pairs:
        groups.setdefault(key, set()).add(rank)
    return {frozenset(ranks) for ranks in groups.values()}


@_check_case.register(MismatchCase)
def _check_mismatch(
    case: MismatchCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    want = _partition(list(enumerate(case.calls)))
    problems = []
    for outcome in outcomes:
        error = outcome.error
        if error is None or "CollectiveMismatchError" not in error.kinds:
            got = error.describe() if error else f"returned {_show(outcome.result)}"
            problems.append(f"rank {outcome.rank}: must raise CollectiveMismatchError, {got}")
            continue
        calls = error.calls or ()
        if sorted(rank for rank, _ in calls) != list(range(len(case.calls))):
            problems.append(
                f"rank {outcome.rank}: the error names the calls of ranks "
                f"{sorted(rank for rank, _ in calls)}, not of every rank"
            )
        elif _partition(calls) != want:
            problems.append(
                f"rank {outcome.rank}: the error groups the ranks as "
                f"{sorted(sorted(group) for group in _partition(calls))}, but they called "
                f"{sorted(sorted(group) for group in want)}"
            )
    return problems
