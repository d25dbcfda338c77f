"""What the loops measure: values logged with `Module.log`, folded and sent to the loggers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from typing_extensions import override

from plait.core import ConfigurationError
from plait.trainer.data import first_tensor_length
from plait.trainer.metrics import Metrics, Number, held, metric_group

if TYPE_CHECKING:
    from plait.core import Strategy
    from plait.trainer.loggers import Logger
    from plait.trainer.progress import Progress
    from plait.trainer.values import LogValue, ReduceFx

__all__ = ["Results"]


class Results:
    """The trainer's metrics: the values being logged now, and those published so far.

    Args:
        loggers: Where published values go (from global rank 0 only).
        progress: The counters (a logged step is the global step).
        strategy: Folds values over the ranks, and says which rank is 0.
        log_every_n_steps: Send step values every n optimizer steps.
    """

    def __init__(
        self,
        loggers: list[Logger],
        progress: Progress,
        strategy: Strategy,
        *,
        log_every_n_steps: int,
    ) -> None:
        self.loggers = loggers
        self.progress = progress
        self.strategy = strategy
        self.log_every_n_steps = log_every_n_steps
        self.callback_metrics: dict[str, Number] = {}
        self.logged_metrics: dict[str, Number] = {}
        self.progress_bar_metrics: dict[str, Number] = {}
        self.log_dir: str | None = None
        # The values of the running loop (None between loops), and its batch on the
        # device (to infer a logged value's batch size).
        self.active: Metrics | None = None
        self.current_batch: object = None

    def record(
        self,
        name: str,
        value: LogValue,
        *,
        prog_bar: bool,
        logger: bool,
        on_step: bool | None,
        on_epoch: bool | None,
        reduce_fx: ReduceFx,
        sync_dist: bool,
        batch_size: int | None,
    ) -> None:
        """Record a value logged with `Module.log` (see there).

        Raises:
            ConfigurationError: No loop is running (``self.log`` outside a step or hook).
        """
        metrics = self.active
        if metrics is None:
            raise ConfigurationError(
                f"self.log({name!r}, ...) was called where no loop runs",
                fix="log inside training_step, validation_step, test_step or their epoch hooks",
            )
        if batch_size is None:
            batch_size = first_tensor_length(self.current_batch)
        metrics.record(
            name,
            value,
            prog_bar=prog_bar,
            logger=logger,
            on_step=on_step,
            on_epoch=on_epoch,
            reduce_fx=reduce_fx,
            sync_dist=sync_dist,
            batch_size=batch_size,
        )

    def log(self, metrics: Mapping[str, Number], step: int | None = None) -> None:
        """Send ``metrics`` to every logger (on global rank 0; nothing elsewhere)."""
        if not metrics or not self.strategy.is_global_zero:
            return
        self.logged_metrics.update(metrics)
        for logger in self.loggers:
            logger.log_metrics(metrics, self.progress.global_step if step is None else step)
            if self.log_dir is None:
                self.log_dir = logger.log_dir

    def publish_step(self, metrics: Metrics, *, stepping: bool) -> None:
        """Make a training batch's step values visible; log them on logging steps."""
        values = metrics.step_values
        if not values:
            return
        to_log: dict[str, Number] = {}
        for name, value in values.items():
            options = metrics.options[name]
            key = f"{name}_step" if options.on_epoch else name
            self.callback_metrics[key] = held(value)
            if options.prog_bar:
                self.progress_bar_metrics[name] = value
            if options.logger:
                to_log[key] = value
        if stepping and self.progress.global_step % self.log_every_n_steps == 0:
            self.log(to_log)

    def publish_epoch(self, metrics: Metrics, *, training: bool) -> dict[str, Number]:
        """Fold the epoch's values over the ranks, make them visible and log them."""
        strategy = self.strategy
        values = metrics.fold(strategy, strategy.world_size, metric_group(strategy.layout))
        options = metrics.epoch_options()
        to_log: dict[str, Number] = {}
        for name, value in values.items():
            both = training and options[name].on_step
            self.callback_metrics[name] = held(value)
            if both:
                self.callback_metrics[f"{name}_epoch"] = held(value)
            if options[name].prog_bar:
                self.progress_bar_metrics[name] = value
            if options[name].logger:
                to_log[f"{name}_epoch" if both else name] = value
        self.log(to_log)
        return values

    @contextlib.contextmanager
    def discarding(self) -> Iterator[None]:
        """Whatever is logged inside is dropped (a padding batch's values count nowhere)."""
        counted = self.active
        self.active = Metrics(stage="validate", training=False)
        try:
            yield
        finally:
            self.active = counted

    def end_run(self) -> None:
        """Forget the run's loop state (its published values stay)."""
        self.active = None
        self.current_batch = None

    @override
    def __getstate__(self) -> dict[str, object]:
        # Travels with the trainer between runs: no values in flight.
        return {**self.__dict__, "active": None, "current_batch": None}
