"""A rank's part of a training example: every run on a fresh strategy of the pool's target.

Each property's part is its `plait.conformance.training.example.TrainingKind` (one
module each: `replicas`, `round_trip`, `resume`, `moves`), on the kit's loop
(`plait.conformance.training.loop`); the comparisons a rank makes itself are in
`plait.conformance.training.compare`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.training.compare import tolerance
from plait.conformance.training.example import TrainingKind
from plait.conformance.training.loop import Refused, TrainingReport, user_value
from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.conformance.target import StrategyTarget
    from plait.conformance.training.cases import TrainingCase

__all__ = ["Refused", "TrainingReport", "run_training", "tolerance", "user_value"]


def run_training(target: StrategyTarget, case: TrainingCase) -> TrainingReport:
    """This rank's part of ``case``: every run on a fresh strategy of ``target``.

    Raises:
        ConfigurationError: ``case`` is not of a registered training kind's case type.
    """
    kind = EXAMPLE_KINDS.kind_of(case)
    if not isinstance(kind, TrainingKind):
        raise ConfigurationError(
            f"{type(case).__qualname__} is the case type of {type(kind).__name__}, "
            "which is not a training kind",
            value=case,
            fix="run it through its own kind, or give a training example's case",
        )
    return kind.run_on(target, case)
