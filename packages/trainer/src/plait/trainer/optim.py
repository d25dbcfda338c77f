"""What `Module.configure_optimizers` may return, checked and made uniform."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal, TypeAlias

import attrs
import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from plait.core import ConfigurationError
from plait.trainer.checks import check_count

__all__ = ["Scheduler", "SchedulerConfig", "parse_optimizers"]

Scheduler: TypeAlias = LRScheduler | ReduceLROnPlateau
"""A learning-rate scheduler of torch."""

_INTERVALS: Final = ("epoch", "step")
_SCHEDULER_KEYS: Final = ("scheduler", "interval", "frequency", "monitor", "name")
_FORMS: Final = (
    "an optimizer; a list of optimizers; ([optimizers], [schedulers]); "
    '{"optimizer": ..., "lr_scheduler": ...}; or a list of such dicts'
)


def _check_interval(value: object) -> Literal["epoch", "step"]:
    if value == "epoch":
        return "epoch"
    if value == "step":
        return "step"
    raise ConfigurationError.invalid_choice("lr_scheduler interval", value, _INTERVALS)


@attrs.frozen
class SchedulerConfig:
    """A scheduler and when it steps.

    Attributes:
        scheduler: The scheduler.
        interval: ``"epoch"`` (after each epoch's validation) or ``"step"`` (after
            each optimizer step).
        frequency: Step it every this many intervals.
        monitor: The logged metric passed to ``ReduceLROnPlateau.step``.
        name: A name for `LearningRateMonitor`, if you want one.
    """

    scheduler: Scheduler
    interval: Literal["epoch", "step"] = attrs.field(default="epoch", converter=_check_interval)
    frequency: int = 1
    monitor: str | None = None
    name: str | None = None

    def __attrs_post_init__(self) -> None:
        check_count("lr_scheduler frequency", self.frequency, minimum=1, example='{"frequency": 1}')
        if isinstance(self.scheduler, ReduceLROnPlateau) and self.monitor is None:
            raise ConfigurationError(
                "ReduceLROnPlateau steps on a metric, and its config names none",
                fix='return {"optimizer": ..., "lr_scheduler": {"scheduler": plateau, '
                '"monitor": "val_loss"}}',
            )

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer the scheduler drives."""
        return self.scheduler.optimizer


def _scheduler(value: object, where: str) -> SchedulerConfig:
    if isinstance(value, LRScheduler | ReduceLROnPlateau):
        return SchedulerConfig(value)
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(_SCHEDULER_KEYS))
        if unknown:
            raise ConfigurationError(
                f"{where}: unknown lr_scheduler keys {unknown}",
                value=unknown,
                choices=_SCHEDULER_KEYS,
            )
        if "scheduler" not in value:
            raise ConfigurationError(
                f"{where}: an lr_scheduler config needs the key 'scheduler'",
                fix='write {"scheduler": StepLR(optimizer, 10), "interval": "epoch"}',
            )
        inner = value["scheduler"]
        if not isinstance(inner, LRScheduler | ReduceLROnPlateau):
            raise ConfigurationError(
                f"{where}: 'scheduler' is a {type(inner).__name__}, not a torch LR scheduler",
                value=inner,
                fix="pass a scheduler from torch.optim.lr_scheduler",
            )
        return SchedulerConfig(inner, **{k: v for k, v in value.items() if k != "scheduler"})
    raise ConfigurationError(
        f"{where}: a {type(value).__name__} is not a learning-rate scheduler",
        value=value,
        fix="pass a scheduler from torch.optim.lr_scheduler, or a dict with 'scheduler'",
    )


def _from_dict(value: Mapping[str, object]) -> tuple[torch.optim.Optimizer, list[SchedulerConfig]]:
    unknown = sorted(set(value) - {"optimizer", "lr_scheduler"})
    if unknown or "optimizer" not in value:
        raise ConfigurationError(
            f"configure_optimizers returned a dict with keys {sorted(value)}",
            value=sorted(value),
            choices=("optimizer", "lr_scheduler"),
            fix='return {"optimizer": optimizer, "lr_scheduler": scheduler} (the second optional)',
        )
    optimizer = value["optimizer"]
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigurationError(
            f"configure_optimizers: 'optimizer' is a {type(optimizer).__name__}",
            value=optimizer,
            fix="pass a torch.optim.Optimizer",
        )
    scheduler = value.get("lr_scheduler")
    return optimizer, [] if scheduler is None else [_scheduler(scheduler, "configure_optimizers")]


def parse_optimizers(  # noqa: PLR0912 (one branch per accepted form, then the checks)
    value: object,
) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    """The optimizers and scheduler configs in what ``configure_optimizers`` returned.

    Raises:
        ConfigurationError: It is none of the accepted forms, names no optimizer, or a
            scheduler drives an optimizer that was not returned.
    """
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[SchedulerConfig] = []
    if isinstance(value, torch.optim.Optimizer):
        optimizers = [value]
    elif isinstance(value, Mapping):
        optimizer, schedulers = _from_dict(value)
        optimizers = [optimizer]
    elif (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(part, Sequence) and not isinstance(part, str) for part in value)
        and not all(isinstance(item, torch.optim.Optimizer) for item in value)
    ):
        first, second = value
        optimizers = list(first)
        schedulers = [_scheduler(item, "configure_optimizers") for item in second]
    elif isinstance(value, Sequence) and not isinstance(value, str):
        optimizers = []
        for item in value:
            if isinstance(item, Mapping):
                optimizer, found = _from_dict(item)
                optimizers.append(optimizer)
                schedulers.extend(found)
            else:
                optimizers.append(item)
    else:
        raise ConfigurationError(
            f"configure_optimizers returned a {type(value).__name__}",
            value=value,
            fix=f"return {_FORMS}",
        )
    for optimizer in optimizers:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigurationError(
                f"configure_optimizers returned a {type(optimizer).__name__} where an "
                "optimizer belongs",
                value=optimizer,
                fix=f"return {_FORMS}",
            )
    if not optimizers:
        raise ConfigurationError(
            "configure_optimizers returned no optimizer",
            fix="return at least one torch.optim.Optimizer",
        )
    known = {id(optimizer) for optimizer in optimizers}
    for config in schedulers:
        if id(config.optimizer) not in known:
            raise ConfigurationError(
                f"a {type(config.scheduler).__name__} drives an optimizer that "
                "configure_optimizers did not return",
                value=config.scheduler,
                fix="make each scheduler over one of the returned optimizers",
            )
    return optimizers, schedulers
