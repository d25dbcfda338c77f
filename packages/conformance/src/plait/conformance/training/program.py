"""A rank's part of a training example: every run on a fresh strategy of the pool's target.

Each example's part is in a module of its own (`replicas`, `round_trip`, `resume`,
`moves`), on the kit's loop (`plait.conformance.training.loop`); the comparisons a
rank makes itself are in `plait.conformance.training.compare`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from plait.conformance.training.compare import tolerance
from plait.conformance.training.loop import Refused, TrainingReport, build_strategy, user_value
from plait.conformance.training.moves import _move_in, _move_out
from plait.conformance.training.replicas import _replicas
from plait.conformance.training.resume import _resume
from plait.conformance.training.round_trip import _round_trip
from plait.core import TrainingSemantics, training_semantics_of

if TYPE_CHECKING:
    from plait.conformance.target import StrategyTarget
    from plait.conformance.training.cases import TrainingCase
    from plait.core import Strategy

__all__ = ["Refused", "TrainingReport", "run_training", "tolerance", "user_value"]


def run_training(target: StrategyTarget, case: TrainingCase) -> TrainingReport:
    """This rank's part of ``case``: every run on a fresh strategy of ``target``."""
    try:
        first = build_strategy(target, case.run, case.checkpoint_io)
    except Refused as refusal:
        return TrainingReport(TrainingSemantics(), refused=str(refusal))
    semantics = training_semantics_of(first)
    try:
        if case.kind == "resume":
            return _resume(first, target, case, semantics)
        return _KINDS[case.kind](first, case, semantics)
    except Refused as refusal:
        return TrainingReport(semantics, refused=str(refusal))


_KINDS: Final[dict[str, Callable[[Strategy, TrainingCase, TrainingSemantics], TrainingReport]]] = {
    "replicas": _replicas,
    "round_trip": _round_trip,
    "move_out": _move_out,
    "move_in": _move_in,
}
