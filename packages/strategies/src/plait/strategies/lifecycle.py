"""What every strategy says about training: its lifecycle hooks and its declared semantics.

A mixin of `plait.strategies.BaseStrategy`. The Trainer calls the hooks
(`plait.core.SupportsLifecycleHooks`, whose methods do nothing and which this
subclasses) on every rank; a strategy overrides the ones it needs (one whose
replicas drift apart between meetings meets them in `on_validation_start` and
`on_train_end`). ``training_semantics`` is what ``plait.conformance`` proves of the
strategy.
"""

from __future__ import annotations

from plait.core import SupportsLifecycleHooks, TrainingSemantics

__all__ = ["Lifecycle"]


class Lifecycle(SupportsLifecycleHooks):
    """The lifecycle hooks, each doing nothing, and the default training semantics."""

    @property
    def training_semantics(self) -> TrainingSemantics:
        """What the strategy promises about training: synchronous replicas by default.

        Override it to declare more (the strategies a checkpoint moves to, the
        precisions to prove) or other semantics (`plait.core.PeriodicAveraging`).
        """
        return TrainingSemantics()
