"""The training examples: plain frozen values, drawn by Hypothesis and sent to every rank.

What every training example holds is defined with the other examples' values, in
`plait.conformance.cases`; this module names the training kit's part of them. Each
property's case type is its own kind's (`ReplicasCase` in
`plait.conformance.training.replicas`, `RoundTripCase` in ``round_trip``,
`ResumeCase` in ``resume``, `MoveCase` in ``moves``).
"""

from plait.conformance.cases import (
    MODELS,
    MODELS_WITH_BUFFERS,
    OPTIMIZERS,
    SCHEDULERS,
    ModelName,
    OptimizerName,
    SchedulerName,
    StateValue,
    StoppedCase,
    TrainingCase,
    TrainingRun,
)

__all__ = [
    "MODELS",
    "MODELS_WITH_BUFFERS",
    "OPTIMIZERS",
    "SCHEDULERS",
    "ModelName",
    "OptimizerName",
    "SchedulerName",
    "StateValue",
    "StoppedCase",
    "TrainingCase",
    "TrainingRun",
]
