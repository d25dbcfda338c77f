"""`RichProgressBar`: steps, epoch, throughput and metrics, drawn on global rank 0 only."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

from typing_extensions import override

from plait.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, ProgressColumn, TaskID

    from plait.trainer.metrics import Number
    from plait.trainer.module import Module
    from plait.trainer.trainer import Trainer
    from plait.trainer.values import StepOutput

__all__ = ["RichProgressBar", "format_metrics"]


def format_metrics(metrics: dict[str, Number]) -> str:
    """``name=value`` pairs, four significant digits, in the order logged."""
    return "  ".join(
        f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in metrics.items()
    )


@functools.cache
def _throughput_column() -> type[ProgressColumn]:
    # rich is imported when a bar is first drawn, not with plait.trainer.
    from rich.progress import ProgressColumn, Task  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    class Throughput(ProgressColumn):
        """Batches per second, as rich measures them over the last few updates."""

        @override
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("" if speed is None else f"{speed:.1f} it/s", style="progress.data.speed")

    return Throughput


class RichProgressBar(Callback):
    """A progress bar per epoch, with batches done, throughput and ``prog_bar`` metrics.

    Drawn on global rank 0 only. When the output is not a terminal (a log file,
    CI), it prints one line per epoch and per evaluation instead of redrawing.

    Args:
        console: Where to draw; standard error's console by default.
        refresh_per_second: How often the bar is redrawn.
    """

    def __init__(self, console: Console | None = None, refresh_per_second: float = 4.0) -> None:
        self._console = console
        self.refresh_per_second = refresh_per_second
        self._progress: Progress | None = None
        self._train: TaskID | None = None
        self._eval: TaskID | None = None
        self._epoch_started = 0.0

    @property
    def console(self) -> Console:
        """The console drawn on."""
        if self._console is None:
            from rich.console import Console  # noqa: PLC0415 - loaded when first used

            self._console = Console(stderr=True)
        return self._console

    @override
    def __getstate__(self) -> dict[str, object]:
        # The bar travels to the ranks empty: each draws (or not) on its own console.
        state = dict(self.__dict__)
        state.update(_console=None, _progress=None, _train=None, _eval=None)
        return state

    def _live(self, trainer: Trainer) -> Progress | None:
        if not trainer.is_global_zero or not self.console.is_terminal:
            return None
        if self._progress is None:
            from rich.progress import (  # noqa: PLC0415 - loaded when first drawn
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                _throughput_column()(),
                TextColumn("{task.fields[metrics]}"),
                console=self.console,
                refresh_per_second=self.refresh_per_second,
            )
            self._progress.start()
        return self._progress

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        self._progress = None
        self._train = None
        self._eval = None

    def _epoch_label(self, trainer: Trainer) -> str:
        total = trainer.max_epochs
        return f"Epoch {trainer.current_epoch}" + (f"/{total - 1}" if total is not None else "")

    @override
    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        self._epoch_started = time.perf_counter()
        progress = self._live(trainer)
        if progress is None:
            return
        if self._train is not None:
            progress.stop_task(self._train)
        self._train = progress.add_task(
            self._epoch_label(trainer), total=trainer.num_training_batches, metrics=""
        )

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: StepOutput, batch: object, batch_idx: int
    ) -> None:
        if self._progress is not None and self._train is not None:
            self._progress.update(
                self._train,
                completed=batch_idx + 1,
                metrics=format_metrics(trainer.progress_bar_metrics),
            )

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if self._progress is not None and self._train is not None:
            self._progress.update(self._train, metrics=format_metrics(trainer.progress_bar_metrics))
            return
        if trainer.is_global_zero:
            elapsed = time.perf_counter() - self._epoch_started
            rate = trainer.num_training_batches / elapsed if elapsed > 0 else 0.0
            metrics = format_metrics(trainer.progress_bar_metrics)
            self.console.print(
                f"{self._epoch_label(trainer)}: {trainer.num_training_batches} batches, "
                f"{elapsed:.1f} s ({rate:.1f} it/s)  {metrics}",
                highlight=False,
            )

    def _start_eval(self, trainer: Trainer, label: str) -> None:
        progress = self._live(trainer)
        if progress is not None:
            self._eval = progress.add_task(label, total=trainer.num_eval_batches, metrics="")

    def _advance_eval(self, batch_idx: int) -> None:
        if self._progress is not None and self._eval is not None:
            self._progress.update(self._eval, completed=batch_idx + 1)

    def _end_eval(self) -> None:
        if self._progress is not None and self._eval is not None:
            self._progress.remove_task(self._eval)
        self._eval = None

    @override
    def on_validation_start(self, trainer: Trainer, module: Module) -> None:
        self._start_eval(trainer, "Validation")

    @override
    def on_validation_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        self._advance_eval(batch_idx)

    @override
    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        self._end_eval()

    @override
    def on_test_start(self, trainer: Trainer, module: Module) -> None:
        self._start_eval(trainer, "Testing")

    @override
    def on_test_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        self._advance_eval(batch_idx)

    @override
    def on_test_end(self, trainer: Trainer, module: Module) -> None:
        self._end_eval()

    @override
    def on_predict_start(self, trainer: Trainer, module: Module) -> None:
        self._start_eval(trainer, "Predicting")

    @override
    def on_predict_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        self._advance_eval(batch_idx)

    @override
    def on_predict_end(self, trainer: Trainer, module: Module) -> None:
        self._end_eval()

    @override
    def teardown(self, trainer: Trainer, module: Module, stage: str) -> None:
        self._stop()

    @override
    def on_exception(self, trainer: Trainer, module: Module, exception: BaseException) -> None:
        self._stop()
