"""`EarlyStopping`: stop training when a metric stops improving, on every rank together."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from typing_extensions import override

from plait.core import ConfigurationError, rank_zero_info, rank_zero_warn
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
    validation), or after each validation run where the fit validates in the middle
    of an epoch or not every epoch (as Lightning does; `check_on_train_epoch_end`
    chooses). Each rank judges its own value; the ranks then agree (any rank
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
        strict: Raise when ``monitor`` was never logged; ``False`` warns once and
            goes on without stopping.
        verbose: Say on rank 0 how each check went (improved, or for how long not).
        check_on_train_epoch_end: Check at each training epoch's end (``True``) or
            after each validation run of the fit (``False``); by default the
            first, unless the fit validates in the middle of an epoch
            (``val_check_interval``) or not every epoch (``check_val_every_n_epoch``).

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
        strict: bool = True,
        verbose: bool = False,
        check_on_train_epoch_end: bool | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ConfigurationError.invalid_choice("mode", mode, ("min", "max"))
        self.monitor = monitor
        self.mode = mode
        self.patience = check_count("patience", patience, minimum=0, example="patience=3")
        self.min_delta = check_number(
            "min_delta", min_delta, positive=False, example="min_delta=1e-4"
        )
        for name, flag in (("strict", strict), ("verbose", verbose)):
            if not isinstance(flag, bool):
                raise ConfigurationError(
                    f"{name}={flag!r} must be True or False", value=flag, fix=f"pass {name}=True"
                )
        if check_on_train_epoch_end not in (None, True, False):
            raise ConfigurationError(
                f"check_on_train_epoch_end={check_on_train_epoch_end!r} must be None, True "
                "or False",
                value=check_on_train_epoch_end,
                fix="pass check_on_train_epoch_end=False to check after each validation",
            )
        self.strict = strict
        self.verbose = verbose
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self._warned_missing = False
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
            if self.verbose:
                before = self.best_score
                gain = "" if not math.isfinite(before) else f" by {abs(before - value):.6g}"
                rank_zero_info(
                    f"EarlyStopping: {self.monitor} improved{gain} to {value:.6g} "
                    f"(min_delta {self.min_delta})"
                )
            self.best_score = value
            self.wait_count = 0
            return None
        self.wait_count += 1
        if self.verbose:
            rank_zero_info(
                f"EarlyStopping: {self.monitor} = {value:.6g} did not improve on "
                f"{self.best_score:.6g} for {self.wait_count} check(s) (patience {self.patience})"
            )
        if self.wait_count > self.patience:
            return (
                f"{self.monitor} did not improve on {self.best_score:.6g} for "
                f"{self.wait_count} checks (patience {self.patience})"
            )
        return None

    def _on_epoch_end(self, trainer: Trainer) -> bool:
        """Whether this fit's checks happen at each training epoch's end."""
        if self.check_on_train_epoch_end is not None:
            return self.check_on_train_epoch_end
        limits = trainer.limits
        return limits.validates_at_epoch_end and limits.check_val_every_n_epoch == 1

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.fast_dev_run:  # one batch decides nothing
            return
        if self._on_epoch_end(trainer):
            self._check(trainer)

    @override
    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.fast_dev_run or trainer.sanity_checking or trainer.state_stage != "fit":
            return
        if not self._on_epoch_end(trainer):
            self._check(trainer)

    def _check(self, trainer: Trainer) -> None:
        metrics = trainer.callback_metrics
        reason: str | None = None
        if self.monitor in metrics:
            reason = self.judge(float(metrics[self.monitor]))
        elif self.strict:
            raise ConfigurationError(
                f"EarlyStopping(monitor={self.monitor!r}) found no such metric; "
                f"logged: {', '.join(sorted(metrics)) or 'nothing'}",
                value=self.monitor,
                suggestion=suggest(self.monitor, metrics),
                fix="log it with self.log(name, value), or monitor one of the logged names, "
                "or pass strict=False to go on without checking",
            )
        elif not self._warned_missing:
            self._warned_missing = True
            rank_zero_warn(
                f"EarlyStopping(monitor={self.monitor!r}, strict=False) found no such "
                f"metric (logged: {', '.join(sorted(metrics)) or 'nothing'}): not checking"
            )
        # Every rank takes part, whatever it judged (or without the value): then all
        # stop, or none.
        if trainer.strategy.reduce_boolean_decision(reason is not None, all=False):
            self.stopped_epoch = trainer.current_epoch
            self.reason = reason or "another rank's value asked to stop"
            trainer.should_stop = True
            rank_zero_info("EarlyStopping at epoch %d: %s", trainer.current_epoch, self.reason)
