"""`EarlyStopping`: stop training when a metric stops improving, on every rank together."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from typing_extensions import override

from plait.core import ConfigurationError, rank_zero_info
from plait.core.errors import suggest
from plait.trainer.callbacks.base import Callback
from plait.trainer.checks import check_count, check_number

if TYPE_CHECKING:
    from plait.core.typing import StateDict
    from plait.trainer.module import Module
    from plait.trainer.trainer import Trainer

__all__ = ["EarlyStopping"]


class EarlyStopping(Callback):
    """Stop `Trainer.fit` once ``monitor`` has not improved for ``patience`` checks.

    It checks at the end of every training epoch (after that epoch's
    validation). Each rank judges its own value; the ranks then agree (any rank
    that would stop stops them all, through the strategy's
    ``reduce_boolean_decision``), so no rank ever leaves the others waiting.

    Args:
        monitor: The logged metric to watch, e.g. ``"val_loss"``.
        mode: ``"min"`` or ``"max"``: which values are better.
        patience: How many checks without improvement to allow.
        min_delta: How much a value must beat the best by to count as improvement.
        check_finite: Stop at once when the value is nan or infinite.
        stopping_threshold: Stop as soon as the value is at least this good.
        divergence_threshold: Stop as soon as the value is worse than this.

    Raises:
        ConfigurationError: An argument is out of range.
    """

    def __init__(
        self,
        monitor: str,
        *,
        mode: Literal["min", "max"] = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ConfigurationError.invalid_choice("mode", mode, ("min", "max"))
        self.monitor = monitor
        self.mode = mode
        self.patience = check_count("patience", patience, minimum=0, example="patience=3")
        self.min_delta = check_number(
            "min_delta", min_delta, positive=False, example="min_delta=1e-4"
        )
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.wait_count = 0
        self.best_score = math.inf if mode == "min" else -math.inf
        self.stopped_epoch: int | None = None
        self.reason = ""

    @property
    @override
    def state_key(self) -> str:
        return f"EarlyStopping{{monitor={self.monitor!r}, mode={self.mode!r}}}"

    @override
    def state_dict(self) -> StateDict:
        return {
            "wait_count": self.wait_count,
            "best_score": self.best_score,
            "stopped_epoch": self.stopped_epoch,
            "patience": self.patience,
        }

    @override
    def load_state_dict(self, state_dict: StateDict) -> None:
        self.wait_count = state_dict["wait_count"]
        self.best_score = state_dict["best_score"]
        self.stopped_epoch = state_dict["stopped_epoch"]

    def _better(self, value: float, than: float) -> bool:
        if self.mode == "min":
            return value < than - self.min_delta
        return value > than + self.min_delta

    def judge(self, value: float) -> str | None:
        """Take one value into account; return why to stop, or ``None`` to go on."""
        if self.check_finite and not math.isfinite(value):
            return f"{self.monitor} = {value} is not finite"
        threshold = self.stopping_threshold
        if threshold is not None and (value == threshold or self._better(value, threshold)):
            return f"{self.monitor} = {value:.6g} reached the stopping threshold {threshold}"
        divergence = self.divergence_threshold
        if divergence is not None and self._better(divergence, value) and value != divergence:
            return (
                f"{self.monitor} = {value:.6g} is worse than the divergence threshold {divergence}"
            )
        if self._better(value, self.best_score):
            self.best_score = value
            self.wait_count = 0
            return None
        self.wait_count += 1
        if self.wait_count > self.patience:
            return (
                f"{self.monitor} did not improve on {self.best_score:.6g} for "
                f"{self.wait_count} checks (patience {self.patience})"
            )
        return None

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.fast_dev_run:  # one batch decides nothing
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            raise ConfigurationError(
                f"EarlyStopping(monitor={self.monitor!r}) found no such metric; "
                f"logged: {', '.join(sorted(metrics)) or 'nothing'}",
                value=self.monitor,
                suggestion=suggest(self.monitor, metrics),
                fix="log it with self.log(name, value), or monitor one of the logged names",
            )
        reason = self.judge(float(metrics[self.monitor]))
        # Every rank takes part, whatever it judged: then all stop, or none.
        if trainer.strategy.reduce_boolean_decision(reason is not None, all=False):
            self.stopped_epoch = trainer.current_epoch
            self.reason = reason or "another rank's value asked to stop"
            trainer.should_stop = True
            rank_zero_info("EarlyStopping at epoch %d: %s", trainer.current_epoch, self.reason)
