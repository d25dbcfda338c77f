"""What a Lightning user's code reads on the `plait.trainer.Trainer`, by Lightning's names.

`Trainer` is built on `TrainerProperties`: its parts as Lightning names them
(``precision_plugin``, ``num_devices``, ``logger``, ``log_dir``), what the running fit
holds (``model``, ``optimizers``, ``lr_schedulers``, the batches of an epoch), what
was logged (``callback_metrics``...) and the callbacks it found. `plait.trainer.trainer`
holds the Trainer's own design: resolving the parts once, the counters, the entry
points.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from plait.trainer.callbacks.checkpoint import ModelCheckpoint
from plait.trainer.callbacks.early_stopping import EarlyStopping

if TYPE_CHECKING:
    import torch

    from plait.core import Accelerator, Precision
    from plait.trainer.callbacks.base import Callback
    from plait.trainer.connector import Connection
    from plait.trainer.loggers import Logger
    from plait.trainer.metrics import Number
    from plait.trainer.module import Module
    from plait.trainer.optim import SchedulerConfig
    from plait.trainer.progress import Progress
    from plait.trainer.results import Results
    from plait.trainer.run_state import Attached

__all__ = ["TrainerProperties"]


class TrainerProperties:
    """The Trainer's properties that Lightning users' code reads, and `log_to_loggers`."""

    connection: Connection
    loggers: list[Logger]
    results: Results
    progress: Progress
    callbacks: list[Callback]
    _attached: Attached | None
    _module: Module | None

    @property
    def accelerator(self) -> Accelerator:
        """The strategy's accelerator."""
        return self.connection.strategy.accelerator

    @property
    def precision_plugin(self) -> Precision:
        """The strategy's precision plugin (Lightning's name for it)."""
        return self.connection.strategy.precision

    @property
    def precision(self) -> str:
        """The precision's name, as Lightning gives it: ``"32-true"``, ``"bf16-mixed"``..."""
        name = getattr(self.connection.strategy.precision, "name", None)
        return name if isinstance(name, str) else type(self.connection.strategy.precision).__name__

    @property
    def num_devices(self) -> int:
        """Devices (processes) on each node."""
        return len(self.connection.devices)

    @property
    def device_ids(self) -> list[int]:
        """The indices of the devices a node's processes use."""
        return list(self.connection.devices)

    @property
    def logger(self) -> Logger | None:
        """The first logger, if any."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str | None:
        """The first logger's directory (known once a run has logged)."""
        return self.results.log_dir

    @property
    def num_training_batches(self) -> int:
        """Batches in the running training epoch (0 when the loader cannot say)."""
        return self.progress.training_batches

    @property
    def num_eval_batches(self) -> int:
        """Batches in the running evaluation or prediction (0 when unknown)."""
        return self.progress.eval_batches

    @property
    def model(self) -> torch.nn.Module | None:
        """The module the run in progress trains, as the strategy wrapped it (DDP's, ...).

        The module itself where the strategy does not wrap it, and before the
        strategy sets it up (in ``configure_model`` and ``configure_optimizers``);
        ``None`` outside a run.
        """
        attached = self._attached
        if attached is not None and attached.wrapped is not attached.steps:
            return attached.wrapped
        return self._module

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The running fit's optimizers, as set up by the strategy (none outside a fit)."""
        return self._attached.optimizers if self._attached is not None else []

    @property
    def lr_schedulers(self) -> list[SchedulerConfig]:
        """The running fit's learning-rate schedulers (none outside a fit)."""
        return self._attached.schedulers if self._attached is not None else []

    # What was logged.

    @property
    def callback_metrics(self) -> dict[str, Number]:
        """Every value logged, by name, as callbacks (checkpoints, early stopping) see it."""
        return self.results.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, Number]:
        """The last value of each metric sent to the loggers."""
        return self.results.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, Number]:
        """The values the progress bar shows."""
        return self.results.progress_bar_metrics

    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        """The `ModelCheckpoint` callbacks."""
        return [callback for callback in self.callbacks if isinstance(callback, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first `ModelCheckpoint`, if any."""
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def early_stopping_callback(self) -> EarlyStopping | None:
        """The first `EarlyStopping`, if any."""
        found = [c for c in self.callbacks if isinstance(c, EarlyStopping)]
        return found[0] if found else None

    # Logging.

    def log_to_loggers(self, metrics: Mapping[str, Number], step: int | None = None) -> None:
        """Send ``metrics`` to every logger (on global rank 0; nothing elsewhere)."""
        self.results.log(metrics, step)
