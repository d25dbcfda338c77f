"""What every strategy says about training: its lifecycle hooks and its declared semantics.

A mixin of `plait.strategies.BaseStrategy`. The Trainer calls the hooks
(`plait.core.SupportsLifecycleHooks`) on every rank; each does nothing here, and a
strategy overrides the ones it needs (one whose replicas drift apart between
meetings meets them in `on_validation_start` and `on_train_end`).
``training_semantics`` is what ``plait.conformance`` proves of the strategy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait.core import TrainingSemantics

if TYPE_CHECKING:
    from plait.core import RunProgress

__all__ = ["Lifecycle"]


class Lifecycle:
    """The lifecycle hooks, each doing nothing, and the default training semantics."""

    @property
    def training_semantics(self) -> TrainingSemantics:
        """What the strategy promises about training: synchronous replicas by default.

        Override it to declare more (the strategies a checkpoint moves to, the
        precisions to prove) or other semantics (`plait.core.PeriodicAveraging`).
        """
        return TrainingSemantics()

    def on_fit_start(self, run: RunProgress) -> None:
        """``fit`` is about to train; ``run`` tells its steps and epochs as they go."""

    def on_fit_end(self) -> None:
        """``fit`` has ended."""

    def on_train_start(self) -> None:
        """Training is about to start (or go on, after a resume)."""

    def on_train_end(self) -> None:
        """Training has ended: its last optimizer step is taken."""

    def on_validation_start(self) -> None:
        """A validation run is about to start."""

    def on_validation_end(self) -> None:
        """A validation run has ended."""

    def on_test_start(self) -> None:
        """A test run is about to start."""

    def on_test_end(self) -> None:
        """A test run has ended."""

    def on_predict_start(self) -> None:
        """A predict run is about to start."""

    def on_predict_end(self) -> None:
        """A predict run has ended."""
