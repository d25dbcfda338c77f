"""The values a module's steps and its logging exchange with the Trainer, as types.

A leaf: the loops, the metrics and the callbacks name them without importing the
module's class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, TypeAlias

if TYPE_CHECKING:
    import torch

    from plait.trainer.metric_objects import MetricObject

__all__ = ["LogValue", "ReduceFx", "StepOutput"]

LogValue: TypeAlias = "torch.Tensor | float | int | bool | MetricObject"
"""What `Module.log` takes: a number, a one-element tensor, or a metric object (torchmetrics')."""

ReduceFx: TypeAlias = Literal["mean", "sum", "max", "min"]
"""How `Module.log` folds a metric's values over an epoch (and over ranks)."""

StepOutput: TypeAlias = "torch.Tensor | Mapping[str, object] | None"
"""What `Module.training_step` returns: the loss, a mapping with ``"loss"``, or ``None`` to skip."""
