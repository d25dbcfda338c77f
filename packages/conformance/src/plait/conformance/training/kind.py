"""The training examples as a kind: every rank trains the example's runs on fresh strategies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from typing_extensions import override

from plait.conformance.cases import TrainingCase
from plait.conformance.kind import ExampleKind, Property
from plait.conformance.outcomes import Outcome
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.training.example import TRAINING_EXAMPLES, check_training
from plait.conformance.training.generate import coverage
from plait.conformance.training.loop import TrainingReport
from plait.conformance.training.program import run_training
from plait.conformance.training.properties import MOVES, TRAINING_PROPERTIES
from plait.conformance.worker import raised

if TYPE_CHECKING:
    from plait.conformance.kind import RankContext
    from plait.core import TrainingSemantics

__all__ = ["TrainingKind"]


class TrainingKind(ExampleKind[TrainingCase]):
    """Each rank runs its part of a training example on fresh strategies of the pool's target.

    The ranks' reports are judged against what the strategy declares
    (`plait.core.TrainingSemantics`); settings every rank refused alike are drawn
    again.
    """

    case_type = TrainingCase
    properties = (*TRAINING_PROPERTIES, MOVES)
    snippet_names = ("TrainingRun",)

    @override
    def property_of(self, case: TrainingCase) -> Property:
        return TRAINING_EXAMPLES.of(case).property

    @override
    def run(self, context: RankContext, case: TrainingCase) -> Outcome:
        assert context.target is not None
        try:
            outcome = Outcome(context.rank, result=run_training(context.target, case))
        except Exception as error:  # noqa: BLE001 - every error is reported, not raised
            outcome = Outcome(context.rank, error=raised(error))
        context.rejoin()
        return outcome

    @override
    def judge(
        self, case: TrainingCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        del devices  # every rank's run is on its own device; the reports say the rest
        return check_training(case, outcomes)

    @override
    def covered(self, cases: Sequence[TrainingCase], semantics: TrainingSemantics) -> str | None:
        """The runs' lengths and the stops, against the period the strategy declares."""
        return coverage(cases, semantics)

    @override
    def refusal(self, outcomes: Sequence[Outcome]) -> str | None:
        refused = {
            outcome.result.refused if isinstance(outcome.result, TrainingReport) else None
            for outcome in outcomes
        }
        if len(refused) == 1:
            return refused.pop()
        return None


EXAMPLE_KINDS.register(TrainingKind())
