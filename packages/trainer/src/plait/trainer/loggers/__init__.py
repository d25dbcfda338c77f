"""Loggers: where logged metrics go. A CSV file, TensorBoard, MLflow, or your own (`Logger`).

One module each, as the callbacks are: `CSVLogger`, `TensorBoardLogger` (the
``tensorboard`` extra) and `MLFlowLogger` (the ``mlflow`` extra); `resolve_loggers`
turns the Trainer's ``logger=`` into a list of them.
"""

from plait.trainer.loggers.base import Logger, SupportsConnect, SupportsLogGraph, next_version
from plait.trainer.loggers.csv_logger import CSVLogger
from plait.trainer.loggers.mlflow_logger import MLFlowLogger, TrackingClient
from plait.trainer.loggers.resolve import is_logger, resolve_loggers
from plait.trainer.loggers.tensorboard_logger import TensorBoardLogger

__all__ = [
    "CSVLogger",
    "Logger",
    "MLFlowLogger",
    "SupportsConnect",
    "SupportsLogGraph",
    "TensorBoardLogger",
    "TrackingClient",
    "is_logger",
    "next_version",
    "resolve_loggers",
]
