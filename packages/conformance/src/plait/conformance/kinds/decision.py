"""``reduce_boolean_decision``: the logical all (or any) of every rank's vote."""

from __future__ import annotations

import functools
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

__all__ = ["DECISION", "DecisionCase", "DecisionKind", "decision_cases", "decision_grid"]


@attrs.frozen
class DecisionCase:
    """Every rank calls ``reduce_boolean_decision(decisions[rank], all=all)``."""

    decisions: tuple[bool, ...]
    all: bool = True


@functools.cache
def decision_cases(world_size: int) -> st.SearchStrategy[DecisionCase]:
    """Each rank votes; the ranks ask for all or any."""
    votes = st.lists(st.booleans(), min_size=world_size, max_size=world_size).map(tuple)
    return st.builds(DecisionCase, votes, st.booleans())


def decision_grid(world_size: int) -> list[Case]:
    """All and any, over unanimous votes and a single dissent at each rank."""
    votes: list[tuple[bool, ...]] = [(True,) * world_size, (False,) * world_size]
    for rank in range(world_size):
        votes.append(tuple(other != rank for other in range(world_size)))
        votes.append(tuple(other == rank for other in range(world_size)))
    return [DecisionCase(vote, every) for every in (True, False) for vote in dict.fromkeys(votes)]


DECISION: Final = Property(
    "reduce_boolean_decision",
    "reduce_boolean_decision(b, all) is the logical all (or any) of every rank's b",
    decision_cases,
    grid=decision_grid,
    over_groups=False,  # it takes no group: always the whole job
)


class DecisionKind(CollectiveKind[DecisionCase]):
    """Every rank calls ``reduce_boolean_decision(decisions[rank], all=all)``."""

    case_type = DecisionCase
    properties = (DECISION,)

    @override
    def call(self, context: RankContext, case: DecisionCase, argument: object) -> object:
        return context.strategy.reduce_boolean_decision(case.decisions[context.rank], all=case.all)

    @override
    def takes_group(self, case: DecisionCase) -> bool:
        return False

    @override
    def judge(
        self, case: DecisionCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        want = all(case.decisions) if case.all else any(case.decisions)
        return [
            f"rank {outcome.rank}: got {outcome.result!r}, expected {want} "
            f"({'all' if case.all else 'any'} of {list(case.decisions)})"
            for outcome in outcomes
            if outcome.result is not want
        ]


EXAMPLE_KINDS.register(DecisionKind())
