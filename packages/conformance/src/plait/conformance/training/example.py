"""The base of every training example kind: each rank's part, and how the reports are judged.

Each training property's examples are a case type of their own, with the
`TrainingKind` that answers for them, registered in
`plait.conformance.EXAMPLE_KINDS` as any kind is (one module each: `replicas`,
`round_trip`, `resume`, `moves`). The harness's side of every example is the same
(`check_training`): each rank sent a `TrainingReport`, they agree on refusing, none
found a problem itself; then the kind's own `TrainingKind.check`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from typing_extensions import override

from plait.conformance.kind import ExampleKind
from plait.conformance.outcomes import Outcome, rank_list
from plait.conformance.training.cases import TrainingCase
from plait.conformance.training.generate import coverage
from plait.conformance.training.loop import Refused, TrainingReport, build_strategy
from plait.conformance.worker import raised
from plait.core import TrainingSemantics, training_semantics_of

if TYPE_CHECKING:
    from plait.conformance.kind import RankContext
    from plait.conformance.target import StrategyTarget
    from plait.core import Strategy

__all__ = [
    "SLOWER",
    "TC",
    "TrainingKind",
    "check_training",
    "reports",
]

SLOWER: Final = 4.0
"""How many of the pool's deadlines a training example may take: it runs a few short
trainings, a hundred collectives, not one."""

TC = TypeVar("TC", bound=TrainingCase)
"""A training example's case type."""


class TrainingKind(ExampleKind[TC]):
    """A kind of training example: each rank runs its part on fresh strategies of the target.

    A subclass names its case type and its property, and says what a rank does
    (`train`) and, where the reports must agree across ranks, how they are judged
    (`check`); the ranks' reports are judged against what the strategy declares
    (`plait.core.TrainingSemantics`), and settings every rank refused alike are drawn
    again.

    Its subclasses set ``case_type`` and ``properties`` (the one training property
    its examples prove), as every `ExampleKind` does.
    """

    snippet_names = ("TrainingRun",)

    @abc.abstractmethod
    def train(
        self,
        strategy: Strategy,
        target: StrategyTarget,
        case: TC,
        semantics: TrainingSemantics,
    ) -> TrainingReport:
        """This rank's part of ``case``, starting on ``strategy`` (fresh, joined).

        More strategies like it come from ``target``; every one the part builds is
        torn down before it returns.

        Raises:
            Refused: The strategy refused the example's settings.
        """

    def check(self, case: TC, reports: Sequence[TrainingReport]) -> list[str]:
        """What the ranks' reports (every rank's, none refused) break besides their own problems."""
        del case, reports
        return []

    def run_on(self, target: StrategyTarget, case: TC) -> TrainingReport:
        """This rank's part of ``case``, on a fresh strategy of ``target`` it builds first."""
        try:
            first = build_strategy(target, case.run, case.checkpoint_io)
        except Refused as refusal:
            return TrainingReport(TrainingSemantics(), refused=str(refusal))
        semantics = training_semantics_of(first)
        try:
            return self.train(first, target, case, semantics)
        except Refused as refusal:
            return TrainingReport(semantics, refused=str(refusal))

    @override
    def run(self, context: RankContext, case: TC) -> Outcome:
        assert context.target is not None
        try:
            outcome = Outcome(context.rank, result=self.run_on(context.target, case))
        except Exception as error:  # noqa: BLE001 - every error is reported, not raised
            outcome = Outcome(context.rank, error=raised(error))
        context.rejoin()
        return outcome

    @override
    def judge(self, case: TC, outcomes: Sequence[Outcome], devices: Sequence[str]) -> list[str]:
        del devices  # every rank's run is on its own device; the reports say the rest
        return check_training(self, case, outcomes)

    @override
    def covered(self, cases: Sequence[TC], semantics: TrainingSemantics) -> str | None:
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


def reports(outcomes: Sequence[Outcome]) -> tuple[list[TrainingReport], list[str]]:
    """Each rank's report, and the problems of ranks that sent none or disagree on refusing."""
    found = [outcome.result for outcome in outcomes]
    problems = [
        f"rank {outcome.rank} sent {type(outcome.result).__name__}, not a training report"
        for outcome in outcomes
        if not isinstance(outcome.result, TrainingReport)
    ]
    kept = [report for report in found if isinstance(report, TrainingReport)]
    if problems:
        return kept, problems
    refused = [index for index, report in enumerate(kept) if report.refused is not None]
    if refused and len(refused) != len(kept):
        others = [index for index in range(len(kept)) if index not in refused]
        problems.append(
            f"{rank_list(refused)} refused the example's settings and {rank_list(others)} "
            f"took them: {kept[refused[0]].refused}"
        )
    return kept, problems


def check_training(kind: TrainingKind[TC], case: TC, outcomes: Sequence[Outcome]) -> list[str]:
    """How the ranks' reports of ``case`` break the declared semantics; empty if they keep it."""
    kept, problems = reports(outcomes)
    if problems or not kept or kept[0].refused is not None:
        return problems
    for index, report in enumerate(kept):
        problems += [f"rank {index}: {problem}" for problem in report.problems]
    if problems:
        return problems
    return kind.check(case, kept)
