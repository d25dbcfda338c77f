"""Mismatched calls: every rank raises `CollectiveMismatchError` naming each rank's call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from typing_extensions import override

from plait.conformance import generate, grid
from plait.conformance.cases import MismatchCase
from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import show
from plait.conformance.worker import materialize

if TYPE_CHECKING:
    from plait.conformance.cases import Call
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = ["MISMATCH", "MismatchKind"]

MISMATCH: Final = Property(
    "mismatch",
    "ranks that disagree on the collective, op, shape, dtype or src all raise "
    "CollectiveMismatchError naming what each rank called, never hang, and the "
    "strategy still works afterwards",
    generate.mismatch_cases,
    grid=grid.mismatch,
    min_world_size=2,
)


class MismatchKind(CollectiveKind[MismatchCase]):
    """The ranks make calls that do not match: every rank must raise, none may hang."""

    case_type = MismatchCase
    properties = (MISMATCH,)
    raises = True
    snippet_names = ("Call", "TensorSpec")

    @override
    def call(self, context: RankContext, case: MismatchCase, argument: object) -> object:
        return _call(context, case.calls[context.rank])

    @override
    def takes_group(self, case: MismatchCase) -> bool:
        return all(call.collective != "reduce_boolean_decision" for call in case.calls)

    @override
    def checks_after(self, case: MismatchCase, world_size: int) -> bool:
        return True

    @override
    def judge(
        self, case: MismatchCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        want = _partition(list(enumerate(case.calls)))
        problems = []
        for outcome in outcomes:
            error = outcome.error
            if error is None or "CollectiveMismatchError" not in error.kinds:
                got = error.describe() if error else f"returned {show(outcome.result)}"
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


def _call(context: RankContext, call: Call) -> object:
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
        src = context.src(int(call.arg))  # type: ignore[call-overload]
        return strategy.broadcast(tensor, src=src, group=group)
    if call.collective == "barrier":
        strategy.barrier(None if call.arg is None else str(call.arg), group=group)
        return None
    return strategy.reduce_boolean_decision(decision=True, all=bool(call.arg))


def _partition(pairs: Sequence[tuple[int, object]]) -> set[frozenset[int]]:
    groups: dict[object, set[int]] = {}
    for rank, key in pairs:
        groups.setdefault(key, set()).add(rank)
    return {frozenset(ranks) for ranks in groups.values()}


EXAMPLE_KINDS.register(MismatchKind())
