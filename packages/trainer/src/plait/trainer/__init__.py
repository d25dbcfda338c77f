"""plait.trainer: the Trainer, the one place where plait's parts are composed.

`Trainer` resolves an accelerator, devices, precision, plugins and a strategy
(by name or instance, in one step) and runs ``fit``, ``validate``, ``test`` and
``predict`` on a `Module`, with callbacks (`ModelCheckpoint`, `EarlyStopping`,
`LearningRateMonitor`, `RichProgressBar`) and loggers (`CSVLogger`,
`TensorBoardLogger`, `MLFlowLogger`). ``plait fit --example digits`` runs the bundled example.
"""

from plait.core import publish_rank
from plait.trainer.callbacks import (
    Callback,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    RichModelSummary,
    RichProgressBar,
)
from plait.trainer.connector import Connection, connect
from plait.trainer.launch import Outcome
from plait.trainer.layer_sync import LayerSync, TorchSyncBatchNorm
from plait.trainer.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger
from plait.trainer.module import DataModule, Module
from plait.trainer.optim import SchedulerConfig
from plait.trainer.stopping import TrainingStopped
from plait.trainer.trainer import Trainer

publish_rank()  # lightning_utilities' rank_zero_only, where a project loaded it first

__all__ = [
    "CSVLogger",
    "Callback",
    "Connection",
    "DataModule",
    "EarlyStopping",
    "LayerSync",
    "LearningRateMonitor",
    "Logger",
    "MLFlowLogger",
    "ModelCheckpoint",
    "ModelSummary",
    "Module",
    "Outcome",
    "RichModelSummary",
    "RichProgressBar",
    "SchedulerConfig",
    "TensorBoardLogger",
    "TorchSyncBatchNorm",
    "Trainer",
    "TrainingStopped",
    "connect",
]
