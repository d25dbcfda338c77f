"""A rank's part of a training example: every run on a fresh strategy of the pool's target.

Each kind of example's part is its `plait.conformance.training.example.TrainingExample`
(one module each: `replicas`, `round_trip`, `resume`, `moves`), on the kit's loop
(`plait.conformance.training.loop`); the comparisons a rank makes itself are in
`plait.conformance.training.compare`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait.conformance.training.compare import tolerance
from plait.conformance.training.example import TRAINING_EXAMPLES
from plait.conformance.training.loop import Refused, TrainingReport, build_strategy, user_value
from plait.core import TrainingSemantics, training_semantics_of

if TYPE_CHECKING:
    from plait.conformance.target import StrategyTarget
    from plait.conformance.training.cases import TrainingCase

__all__ = ["Refused", "TrainingReport", "run_training", "tolerance", "user_value"]


def run_training(target: StrategyTarget, case: TrainingCase) -> TrainingReport:
    """This rank's part of ``case``: every run on a fresh strategy of ``target``."""
    example = TRAINING_EXAMPLES.of(case)
    try:
        first = build_strategy(target, case.run, case.checkpoint_io)
    except Refused as refusal:
        return TrainingReport(TrainingSemantics(), refused=str(refusal))
    semantics = training_semantics_of(first)
    try:
        return example.run(first, target, case, semantics)
    except Refused as refusal:
        return TrainingReport(semantics, refused=str(refusal))
