"""The training kit: what a strategy does to training, proved on drawn runs.

A strategy declares its `plait.core.TrainingSemantics`; the properties here prove
it on the persistent rank pools of the collective contract: the declared semantics
replica by replica (`TRAINING_PROPERTIES`), checkpoint round trips with every
checkpoint IO, exact resumes, and moves to the strategies it names (`prove_moves`).
Its examples (`TrainingCase`) are a kind of their own (`TrainingKind`).
`plait.conformance.TrainingSuite` runs them under pytest.
"""

from plait.conformance.training.cases import TrainingCase, TrainingRun
from plait.conformance.training.kind import TrainingKind
from plait.conformance.training.properties import (
    MOVES,
    TRAINING_PROPERTIES,
    MoveViolation,
    prove_moves,
    reproduce_move,
    training_property,
)
from plait.conformance.training.reference import Reference, describe, reference

__all__ = [
    "MOVES",
    "TRAINING_PROPERTIES",
    "MoveViolation",
    "Reference",
    "TrainingCase",
    "TrainingKind",
    "TrainingRun",
    "describe",
    "prove_moves",
    "reference",
    "reproduce_move",
    "training_property",
]
