"""Bad arguments: the documented error, naming the value, on every rank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
import torch
from typing_extensions import override

from plait.conformance import generate, grid
from plait.conformance.cases import BadArgumentCase
from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import show

if TYPE_CHECKING:
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = ["BAD_ARGUMENTS", "BadArgumentKind"]

BAD_ARGUMENTS: Final = Property(
    "bad_arguments",
    "a value that is not a tensor or number raises TypeError naming its type; an "
    "unknown op ConfigurationError; src outside the ranks or a timeout <= 0 "
    "ValueError; on every rank, and the strategy still works afterwards",
    generate.bad_argument_cases,
    grid=grid.bad_arguments,
)


class BadArgumentKind(CollectiveKind[BadArgumentCase]):
    """Every rank calls a collective with the same bad argument."""

    case_type = BadArgumentCase
    properties = (BAD_ARGUMENTS,)
    raises = True
    snippet_names = ("Call", "TensorSpec")

    @override
    def call(self, context: RankContext, case: BadArgumentCase, argument: object) -> object:
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

    @override
    def checks_after(self, case: BadArgumentCase, world_size: int) -> bool:
        return True

    @override
    def for_group(
        self, case: BadArgumentCase, *, group_size: int, world_size: int
    ) -> BadArgumentCase:
        """A ``src`` meant to be outside the group is made one outside the job.

        A global rank past the group's size may be a member of another group.
        """
        if (
            case.collective == "broadcast"
            and isinstance(case.value, int)
            and group_size <= case.value < world_size
        ):
            return attrs.evolve(case, value=case.value + world_size - group_size)
        return case

    @override
    def judge(
        self, case: BadArgumentCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        problems = []
        call = f"{case.collective}({case.argument}={case.value!r})"
        for outcome in outcomes:
            error = outcome.error
            if error is None or case.expected not in error.kinds:
                got = error.describe() if error else f"returned {show(outcome.result)}"
                problems.append(f"rank {outcome.rank}: {call} must raise {case.expected}, {got}")
                continue
            named = type(case.value).__name__ if case.expected == "TypeError" else str(case.value)
            if named not in error.message:
                problems.append(
                    f"rank {outcome.rank}: the {error.type_name} of {call} does not name "
                    f"{named!r}: {error.message!r}"
                )
        return problems


EXAMPLE_KINDS.register(BadArgumentKind())
