"""Metric objects that keep their state over batches (torchmetrics'), as `Module.log` takes them.

Lightning code logs a torchmetrics ``Metric`` itself: ``self.log("train/acc",
self.train_acc)`` after calling it on the batch. Such an object is recognised by
what it does (`MetricObject`), so plait never imports torchmetrics: its batch value
is the step's, its ``compute()`` (which syncs over the ranks itself) the epoch's,
and it is reset when the epoch ends.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["MetricObject", "states_kept"]


@runtime_checkable
class MetricObject(Protocol):
    """A metric that accumulates its state over batches: a torchmetrics ``Metric``.

    ``update`` adds a batch, ``compute`` gives the value of every batch so far (over
    every rank, where it syncs), ``reset`` starts afresh. Called as a function, it
    updates and keeps the batch's own value (torchmetrics' ``_forward_cache``).
    """

    # Any signature: each metric takes its own arguments (preds and target, a value...).
    def update(self, *args: Any, **kwargs: Any) -> None:
        """Add a batch to the state."""
        ...

    def compute(self) -> object:
        """The value of every batch added since the last reset."""
        ...

    def reset(self) -> None:
        """Forget every batch."""
        ...


@contextlib.contextmanager
def states_kept(module: torch.nn.Module) -> Iterator[None]:
    """Every metric object in ``module`` comes out with the state it went in with.

    For a batch run only to keep the ranks in step (an evaluation batch repeated on a
    rank with fewer): the values it logs are dropped, and a metric the step updates
    must not count it either. A torchmetrics ``Metric``'s state is its
    ``metric_state``; others are left alone.
    """
    saved = []
    for submodule in module.modules():
        state = getattr(submodule, "metric_state", None)
        if isinstance(submodule, MetricObject) and isinstance(state, dict):
            counted = getattr(submodule, "_update_count", None)
            saved.append((submodule, copy.deepcopy(state), counted))
    try:
        yield
    finally:
        for submodule, state, counted in saved:
            for key, value in state.items():
                setattr(submodule, key, value)
            # torchmetrics' count of updates, and its cached compute() (stale now).
            if counted is not None:
                vars(submodule)["_update_count"] = counted
            if "_computed" in vars(submodule):
                vars(submodule)["_computed"] = None
