"""``broadcast``: every rank gets a value equal to ``src``'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from plait.conformance.cases import BroadcastCase, TensorSpec
from plait.conformance.spec import _check_case, _check_tensor_equal, _show, same_object
from plait.conformance.worker import _Context, _src, invoke

if TYPE_CHECKING:
    from plait.conformance.outcomes import Outcome

__all__: list[str] = []


@invoke.register(BroadcastCase)
def _invoke_broadcast(
    case: BroadcastCase, context: _Context, argument: object
) -> tuple[object, None]:
    strategy = context.strategy
    group = context.dimension
    return strategy.broadcast(argument, src=_src(context, case.src), group=group), None


@_check_case.register(BroadcastCase)
def _check_broadcast(
    case: BroadcastCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    sent = case.objects[case.src]
    problems = []
    for outcome in outcomes:
        if isinstance(sent, TensorSpec):
            problem = _check_tensor_equal(
                outcome.result,
                sent,
                rank=outcome.rank,
                shape=sent.shape,
                values=sent.values,
                device=devices[outcome.rank],
            )
            if problem:
                problems.append(problem + f" (broadcast from src={case.src})")
        elif not same_object(outcome.result, sent):
            problems.append(
                f"rank {outcome.rank}: got {_show(outcome.result)}, expected src={case.src}'s "
                f"{sent!r}"
            )
    return problems
