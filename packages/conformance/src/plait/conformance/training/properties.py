"""The training properties: what a strategy does to training, proved on drawn runs.

Each runs on the same persistent rank pools as the collective contract, one example
at a time: every rank trains the example's run on fresh strategies of the pool's
target (a new process's view), and the harness judges the ranks' reports against
what the strategy declares (`plait.core.TrainingSemantics`). Each property is its
example's (`replicas`, `round_trip`, `resume`, `moves`).
"""

from __future__ import annotations

from typing import Final

from plait.conformance.properties import property_of
from plait.conformance.training.moves import MOVES, MoveViolation, prove_moves, reproduce_move
from plait.conformance.training.replicas import DECLARED_SEMANTICS
from plait.conformance.training.resume import RESUME_EXACTNESS
from plait.conformance.training.round_trip import CHECKPOINT_ROUND_TRIP

__all__ = [
    "MOVES",
    "TRAINING_PROPERTIES",
    "MoveViolation",
    "prove_moves",
    "reproduce_move",
    "training_property",
]

TRAINING_PROPERTIES: Final = (DECLARED_SEMANTICS, CHECKPOINT_ROUND_TRIP, RESUME_EXACTNESS)
"""The training properties, in the order the suite runs them (the moves have their own)."""


training_property: Final = property_of
"""The training property whose examples look like ``case``: `plait.conformance.property_of`,
which answers for a training example as for any (its kind is registered)."""
