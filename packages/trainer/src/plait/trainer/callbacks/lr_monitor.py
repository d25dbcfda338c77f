"""`LearningRateMonitor`: send every optimizer's learning rates to the loggers."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Literal

from typing_extensions import override

from plait.core import ConfigurationError
from plait.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    import torch

    from plait.trainer.module import Module
    from plait.trainer.trainer import Trainer

__all__ = ["LearningRateMonitor", "learning_rates"]


def learning_rates(optimizers: list[torch.optim.Optimizer]) -> dict[str, float]:
    """The learning rate of each parameter group, by a readable name.

    ``lr-SGD`` for one SGD optimizer of one group; ``lr-Adam/pg1`` for a second
    group; ``lr-Adam-1`` for a second Adam optimizer.
    """
    counts = Counter(type(optimizer).__name__ for optimizer in optimizers)
    seen: Counter[str] = Counter()
    rates: dict[str, float] = {}
    for optimizer in optimizers:
        kind = type(optimizer).__name__
        name = f"lr-{kind}" if counts[kind] == 1 else f"lr-{kind}-{seen[kind]}"
        seen[kind] += 1
        groups = optimizer.param_groups
        for index, group in enumerate(groups):
            key = name if len(groups) == 1 else f"{name}/pg{index}"
            rates[key] = float(group["lr"])
    return rates


class LearningRateMonitor(Callback):
    """Log the learning rates at every optimizer step or at the start of every epoch.

    Args:
        logging_interval: ``"step"`` or ``"epoch"``; by default, each scheduler's
            own interval (``"epoch"`` when there is no scheduler).

    Raises:
        ConfigurationError: Another interval was given.
    """

    def __init__(self, logging_interval: Literal["step", "epoch"] | None = None) -> None:
        if logging_interval not in ("step", "epoch", None):
            raise ConfigurationError.invalid_choice(
                "logging_interval", logging_interval, ("step", "epoch")
            )
        self.logging_interval = logging_interval
        self.history: list[tuple[int, dict[str, float]]] = []

    def _interval(self, trainer: Trainer) -> str:
        if self.logging_interval is not None:
            return self.logging_interval
        intervals = {config.interval for config in trainer.lr_schedulers}
        return "step" if "step" in intervals else "epoch"

    def _log(self, trainer: Trainer) -> None:
        rates = learning_rates(trainer.optimizers)
        self.history.append((trainer.global_step, rates))
        trainer.log_to_loggers(rates)

    @override
    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        if self._interval(trainer) == "epoch":
            self._log(trainer)

    @override
    def on_train_batch_start(
        self, trainer: Trainer, module: Module, batch: object, batch_idx: int
    ) -> None:
        if self._interval(trainer) == "step" and trainer.is_optimizer_step_batch(batch_idx):
            self._log(trainer)
