"""Callbacks: the hook API, checkpoints, early stopping, learning rates, progress, summaries."""

from plait.trainer.callbacks.base import Callback
from plait.trainer.callbacks.checkpoint import ModelCheckpoint
from plait.trainer.callbacks.early_stopping import EarlyStopping
from plait.trainer.callbacks.lr_monitor import LearningRateMonitor
from plait.trainer.callbacks.model_summary import ModelSummary, RichModelSummary
from plait.trainer.callbacks.progress import RichProgressBar

__all__ = [
    "Callback",
    "EarlyStopping",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "RichModelSummary",
    "RichProgressBar",
]
