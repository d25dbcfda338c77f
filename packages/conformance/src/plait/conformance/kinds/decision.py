"""``reduce_boolean_decision``: the logical all (or any) of every rank's vote."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from typing_extensions import override

from plait.conformance import generate, grid
from plait.conformance.cases import DecisionCase
from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.registry import EXAMPLE_KINDS

if TYPE_CHECKING:
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = ["DECISION", "DecisionKind"]

DECISION: Final = Property(
    "reduce_boolean_decision",
    "reduce_boolean_decision(b, all) is the logical all (or any) of every rank's b",
    generate.decision_cases,
    grid=grid.decisions,
    over_groups=False,  # it takes no group: always the whole job
)


class DecisionKind(CollectiveKind[DecisionCase]):
    """Every rank calls ``reduce_boolean_decision(decisions[rank], all=all)``."""

    case_type = DecisionCase
    properties = (DECISION,)
    snippet_names = ("Call", "TensorSpec")

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
