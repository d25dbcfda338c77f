"""What every loop of a run reads: the settings of how ``fit`` steps, and the run's context.

A leaf of the Trainer: the loops read it, and the stages assemble the loops from it.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Generic, Protocol, TypeVar, cast, overload

import attrs

from plait.core import STOP_TIMEOUT, ConfigurationError
from plait.trainer.checks import check_count, check_number, check_timeout
from plait.trainer.stopping import parse_stop_signals

if TYPE_CHECKING:
    from plait.core import GradientClipAlgorithm, Strategy
    from plait.trainer.limits import Limits
    from plait.trainer.progress import Progress
    from plait.trainer.results import Results

__all__ = ["LoopContext", "LoopSettings", "Setting"]

T = TypeVar("T")

_CLIP_ALGORITHMS: Final = ("norm", "value")


def _accumulate(value: object) -> int:
    return check_count(
        "accumulate_grad_batches", value, minimum=1, example="accumulate_grad_batches=1"
    )


def _clip_algorithm(value: object) -> GradientClipAlgorithm:
    if value == "norm" or value == "value":  # noqa: PLR1714 - narrows to the Literal
        return value
    raise ConfigurationError.invalid_choice("gradient_clip_algorithm", value, _CLIP_ALGORITHMS)


def _clip_val(value: object) -> float | None:
    if value is None or (type(value) in (int, float) and value == 0):
        return None  # 0 means no clipping, as in Lightning
    return check_number("gradient_clip_val", value, positive=True, example="gradient_clip_val=1.0")


def _stop_timeout(value: object) -> float | None:
    return None if value is None else check_timeout("stop_timeout", value).total_seconds()


@attrs.frozen
class LoopSettings:
    """What the Trainer's arguments say of how ``fit`` steps: resolved and checked once.

    Each is given as the Trainer takes it (``stop_signals="auto"``, a timeout in
    seconds or a `timedelta`, a clipping value of 0 for none) and kept resolved.

    Raises:
        ConfigurationError: A value the Trainer refuses, named with its fix.
    """

    accumulate_grad_batches: int = attrs.field(default=1, converter=_accumulate)
    gradient_clip_algorithm: GradientClipAlgorithm = attrs.field(
        default="norm", converter=_clip_algorithm
    )
    gradient_clip_val: float | None = attrs.field(default=None, converter=_clip_val)
    stop_signals: tuple[signal.Signals, ...] = attrs.field(
        default="auto", converter=parse_stop_signals
    )
    stop_timeout: float | None = attrs.field(default=STOP_TIMEOUT, converter=_stop_timeout)
    detect_anomaly: bool = attrs.field(default=False, converter=bool)


class _HasSettings(Protocol):
    loop_settings: LoopSettings


class Setting(Generic[T]):
    """A Trainer attribute kept in its `LoopSettings`: read from them, set by remaking them.

    Setting one checks it as the Trainer's constructor does, and the next run uses it.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, instance: _HasSettings, owner: type) -> T: ...

    def __get__(self, instance: _HasSettings | None, owner: type) -> Setting[T] | T:
        if instance is None:
            return self
        return cast("T", getattr(instance.loop_settings, self._name))

    def __set__(self, instance: _HasSettings, value: T) -> None:
        changes: dict[str, object] = {self._name: value}
        instance.loop_settings = attrs.evolve(instance.loop_settings, **changes)


@attrs.frozen
class LoopContext:
    """What every loop of a run reads: the strategy, the Trainer's counters and settings.

    Attributes:
        strategy: The ranks' collectives and the device.
        progress: The counters (they outlive a run).
        results: Where logged values go.
        limits: Where training stops, and when it validates.
        settings: How ``fit`` steps.
        sanity: The context a sanity check runs in (the trainer says it checks).
    """

    strategy: Strategy
    progress: Progress
    results: Results
    limits: Limits
    settings: LoopSettings
    sanity: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
