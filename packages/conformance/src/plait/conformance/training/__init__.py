"""The training kit: what a strategy does to training, proved on drawn runs.

A strategy declares its `plait.core.TrainingSemantics`; the properties here prove
it on the persistent rank pools of the collective contract: the declared semantics
replica by replica (`TRAINING_PROPERTIES`), checkpoint round trips with every
checkpoint IO, exact resumes, and moves to the strategies it names (`prove_moves`).
Each property's examples are a case type of their own (`ReplicasCase`,
`RoundTripCase`, `ResumeCase`, `MoveCase`, each a `TrainingCase`), with the
`TrainingKind` that answers for them in `plait.conformance.EXAMPLE_KINDS`.
`plait.conformance.TrainingSuite` runs them under pytest.
"""

from plait.conformance.training.cases import StoppedCase, TrainingCase, TrainingRun
from plait.conformance.training.example import TrainingKind
from plait.conformance.training.moves import MoveCase
from plait.conformance.training.properties import (
    MOVES,
    TRAINING_PROPERTIES,
    MoveViolation,
    prove_moves,
    reproduce_move,
    training_property,
)
from plait.conformance.training.reference import Reference, describe, reference
from plait.conformance.training.replicas import ReplicasCase
from plait.conformance.training.resume import ResumeCase
from plait.conformance.training.round_trip import RoundTripCase

__all__ = [
    "MOVES",
    "TRAINING_PROPERTIES",
    "MoveCase",
    "MoveViolation",
    "Reference",
    "ReplicasCase",
    "ResumeCase",
    "RoundTripCase",
    "StoppedCase",
    "TrainingCase",
    "TrainingKind",
    "TrainingRun",
    "describe",
    "prove_moves",
    "reference",
    "reproduce_move",
    "training_property",
]
