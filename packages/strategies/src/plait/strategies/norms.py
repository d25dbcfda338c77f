"""The layers whose running statistics a strategy keeps apart from its parameters' dtype."""

from __future__ import annotations

from typing import Final

import torch

__all__ = ["BATCH_NORMS"]

BATCH_NORMS: Final = (
    torch.nn.BatchNorm1d,
    torch.nn.BatchNorm2d,
    torch.nn.BatchNorm3d,
    torch.nn.SyncBatchNorm,
)
"""Batch normalization layers: running statistics updated in training, kept as buffers."""
