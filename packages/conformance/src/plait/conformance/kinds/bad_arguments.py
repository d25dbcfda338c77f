"""Bad arguments: the documented error, naming the value, on every rank."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
import torch
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import show

if TYPE_CHECKING:
    from plait.conformance.cases import Case
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = [
    "BAD_ARGUMENTS",
    "BadArgumentCase",
    "BadArgumentKind",
    "bad_argument_cases",
    "bad_argument_grid",
    "bad_argument_table",
]


@attrs.frozen
class BadArgumentCase:
    """Every rank calls ``collective`` with the same bad argument ``value``.

    ``expected`` is the documented error: ``"TypeError"``, ``"ValueError"`` or
    ``"ConfigurationError"``.
    """

    collective: str
    argument: str
    value: object
    expected: str


def bad_argument_table(
    world_size: int,
) -> tuple[tuple[str, str, tuple[object, ...], str], ...]:
    """Each documented bad argument: collective, argument, bad values, the error it raises."""
    not_numbers: tuple[object, ...] = ("1", b"1", None, [1.0], {"value": 1}, (2,))
    return (
        ("reduce", "value", not_numbers, "TypeError"),
        (
            "reduce",
            "reduce_op",
            ("median", "mode", "add", "averag", "bitwise_and", "xor"),
            "ConfigurationError",
        ),
        ("broadcast", "src", (-1, world_size, world_size + 1, 2**31), "ValueError"),
        ("all_gather", "tensor", not_numbers, "TypeError"),
        ("barrier", "timeout", (0, -1, 0.0, -0.5), "ValueError"),
    )


@functools.cache
def bad_argument_cases(world_size: int) -> st.SearchStrategy[BadArgumentCase]:
    """A bad argument every rank passes alike, and the error the contract documents."""
    return st.one_of(
        *(
            st.builds(
                BadArgumentCase,
                st.just(collective),
                st.just(argument),
                st.sampled_from(values),
                st.just(expected),
            )
            for collective, argument, values, expected in bad_argument_table(world_size)
        )
    )


def bad_argument_grid(world_size: int) -> list[Case]:
    """Every documented bad argument, every rank passing it alike."""
    return [
        BadArgumentCase(collective, argument, value, expected)
        for collective, argument, values, expected in bad_argument_table(world_size)
        for value in values
    ]


BAD_ARGUMENTS: Final = Property(
    "bad_arguments",
    "a value that is not a tensor or number raises TypeError naming its type; an "
    "unknown op ConfigurationError; src outside the ranks or a timeout <= 0 "
    "ValueError; on every rank, and the strategy still works afterwards",
    bad_argument_cases,
    grid=bad_argument_grid,
)


class BadArgumentKind(CollectiveKind[BadArgumentCase]):
    """Every rank calls a collective with the same bad argument."""

    case_type = BadArgumentCase
    properties = (BAD_ARGUMENTS,)
    raises = True

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
