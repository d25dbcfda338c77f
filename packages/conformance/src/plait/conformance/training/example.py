"""A kind of training example: its property, each rank's part, and how the reports are judged.

Every training example is a `TrainingCase`; its ``kind`` names the
`TrainingExample` that answers for it in `TRAINING_EXAMPLES` (one module each:
`replicas`, `round_trip`, `resume`, `moves`). The harness's side of every example
is the same (`check_training`): each rank sent a `TrainingReport`, they agree on
refusing, none found a problem itself; then the example's own judge.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Final

from plait.conformance.outcomes import rank_list
from plait.conformance.training.loop import TrainingReport
from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.conformance.cases import Kind, TrainingCase
    from plait.conformance.kind import Property
    from plait.conformance.outcomes import Outcome
    from plait.conformance.target import StrategyTarget
    from plait.core import Strategy, TrainingSemantics

__all__ = [
    "SLOWER",
    "TRAINING_EXAMPLES",
    "TrainingExample",
    "TrainingExamples",
    "check_training",
    "reports",
]

SLOWER: Final = 4.0
"""How many of the pool's deadlines a training example may take: it runs a few short
trainings, a hundred collectives, not one."""


class TrainingExample(abc.ABC):
    """One kind of training example (a value of ``TrainingCase.kind``).

    Attributes:
        kind: The ``TrainingCase.kind`` it answers for.
        property: The training property its examples prove.
    """

    kind: ClassVar[Kind]
    property: ClassVar[Property]

    @abc.abstractmethod
    def run(
        self,
        strategy: Strategy,
        target: StrategyTarget,
        case: TrainingCase,
        semantics: TrainingSemantics,
    ) -> TrainingReport:
        """This rank's part of ``case``, starting on ``strategy`` (fresh, joined).

        More strategies like it come from ``target``; every one the part builds is
        torn down before it returns.

        Raises:
            Refused: The strategy refused the example's settings.
        """

    def judge(self, case: TrainingCase, reports: Sequence[TrainingReport]) -> list[str]:
        """What the ranks' reports (every rank's, none refused) break besides their own problems."""
        del case, reports
        return []


class TrainingExamples:
    """The training examples, by the ``TrainingCase.kind`` each answers for."""

    def __init__(self) -> None:
        self._examples: dict[str, TrainingExample] = {}

    def register(self, example: TrainingExample) -> TrainingExample:
        """Make ``example`` the one for its kind; returns it.

        Raises:
            ConfigurationError: Its kind has an example already.
        """
        held = self._examples.get(example.kind)
        if held is not None:
            raise ConfigurationError(
                f"the training example {example.kind!r} is already {type(held).__name__}'s",
                value=example,
                fix="give the new example a kind of its own",
            )
        self._examples[example.kind] = example
        return example

    def of(self, case: TrainingCase) -> TrainingExample:
        """The example ``case`` is one of.

        Raises:
            ConfigurationError: Its kind names none (the kinds are listed).
        """
        found = self._examples.get(case.kind)
        if found is None:
            raise ConfigurationError.invalid_choice(
                "training example kind", case.kind, sorted(self._examples)
            )
        return found


TRAINING_EXAMPLES: Final = TrainingExamples()
"""Every training example, by kind."""


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


def check_training(case: TrainingCase, outcomes: Sequence[Outcome]) -> list[str]:
    """How the ranks' reports of ``case`` break the declared semantics; empty if they keep it."""
    kept, problems = reports(outcomes)
    if problems or not kept or kept[0].refused is not None:
        return problems
    for index, report in enumerate(kept):
        problems += [f"rank {index}: {problem}" for problem in report.problems]
    if problems:
        return problems
    return TRAINING_EXAMPLES.of(case).judge(case, kept)
