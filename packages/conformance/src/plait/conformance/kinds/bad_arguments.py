"""Bad arguments: the documented error, naming the value, on every rank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from plait.conformance.cases import BadArgumentCase
from plait.conformance.spec import _check_case, _show
from plait.conformance.worker import _Context, invoke

if TYPE_CHECKING:
    from plait.conformance.outcomes import Outcome

__all__: list[str] = []


def _bad_argument(context: _Context, case: BadArgumentCase) -> object:
    strategy = context.strategy
    group = context.dimension
    good = torch.ones(2, device=context.device)
    if case.collective == "reduce" and case.argument == "value":
        return strategy.reduce(case.value, group=group, reduce_op="sum")  # type: ignore[call-overload]
    if case.collective == "reduce":
        return strategy.reduce(good, group=group, reduce_op=case.value)  # type: ignore[call-overload]
    if case.collective == "broadcast":
        return strategy.broadcast(good, src=case.value, group=group)  # type: ignore[arg-type]
    if case.collective == "all_gather":
        return strategy.all_gather(case.value, group=group)  # type: ignore[arg-type]
    strategy.barrier(timeout=case.value, group=group)  # type: ignore[arg-type]
    return None


@invoke.register(BadArgumentCase)
def _invoke_bad_argument(
    case: BadArgumentCase, context: _Context, argument: object
) -> tuple[object, None]:
    return _bad_argument(context, case), None


@_check_case.register(BadArgumentCase)
def _check_bad_argument(
    case: BadArgumentCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    problems = []
    call = f"{case.collective}({case.argument}={case.value!r})"
    for outcome in outcomes:
        error = outcome.error
        if error is None or case.expected not in error.kinds:
            got = error.describe() if error else f"returned {_show(outcome.result)}"
            problems.append(f"rank {outcome.rank}: {call} must raise {case.expected}, {got}")
            continue
        named = type(case.value).__name__ if case.expected == "TypeError" else str(case.value)
        if named not in error.message:
            problems.append(
                f"rank {outcome.rank}: the {error.type_name} of {call} does not name "
                f"{named!r}: {error.message!r}"
            )
    return problems
