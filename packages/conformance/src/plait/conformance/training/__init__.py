"""The training kit: what a strategy does to training, proved on drawn runs.

A strategy declares its `plait.core.TrainingSemantics`; the properties here prove
it on the persistent rank pools of the collective contract: the declared semantics
replica by replica (`TRAINING_PROPERTIES`), checkpoint round trips with every
checkpoint IO, exact resumes, and moves to the strategies it names (`prove_moves`).
`plait.conformance.TrainingSuite` runs them under pytest.

Its names are imported on first use: the examples' cases (`TrainingCase`) are part
of every pool's vocabulary, and the rest of the kit imports the pools.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from plait.conformance.training.cases import TrainingCase, TrainingRun
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
    "TrainingRun",
    "describe",
    "prove_moves",
    "reference",
    "reproduce_move",
    "training_property",
]

_HOMES: Final = {
    "TrainingCase": "cases",
    "TrainingRun": "cases",
    "MOVES": "properties",
    "TRAINING_PROPERTIES": "properties",
    "MoveViolation": "properties",
    "prove_moves": "properties",
    "reproduce_move": "properties",
    "training_property": "properties",
    "Reference": "reference",
    "describe": "reference",
    "reference": "reference",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
