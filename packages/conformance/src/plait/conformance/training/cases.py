"""The training examples: plain frozen values, drawn by Hypothesis and sent to every rank.

They are defined with the other examples' values, in `plait.conformance.cases`; this
module names the training kit's part of them.
"""

from plait.conformance.cases import (
    KINDS,
    MODELS,
    MODELS_WITH_BUFFERS,
    OPTIMIZERS,
    SCHEDULERS,
    Kind,
    ModelName,
    OptimizerName,
    SchedulerName,
    StateValue,
    TrainingCase,
    TrainingRun,
)

__all__ = [
    "KINDS",
    "MODELS",
    "MODELS_WITH_BUFFERS",
    "OPTIMIZERS",
    "SCHEDULERS",
    "Kind",
    "ModelName",
    "OptimizerName",
    "SchedulerName",
    "StateValue",
    "TrainingCase",
    "TrainingRun",
]
