"""What `Module.log` records: step values as they come, epoch values folded over ranks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import attrs
import torch

from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.core import Collectives
    from plait.trainer.module import LogValue, ReduceFx

__all__ = ["MetricOptions", "Metrics", "Number", "to_number"]

Number = float | int
"""A logged value once recorded: a Python number."""

_EPOCH_OPS: Final[dict[str, str]] = {"max": "max", "min": "min"}


def to_number(name: str, value: object) -> Number:
    """``value`` as a Python number: an int stays an int, a one-element tensor is read.

    Raises:
        ConfigurationError: It is neither a number nor a one-element tensor.
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ConfigurationError(
                f"self.log({name!r}, ...) got a tensor of shape {tuple(value.shape)}; "
                "a logged value is one number",
                value=tuple(value.shape),
                fix="log a scalar, e.g. tensor.mean() or tensor.sum()",
            )
        item = value.detach().item()
        return int(item) if isinstance(item, bool) else item
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    raise ConfigurationError(
        f"self.log({name!r}, ...) got a {type(value).__name__}; a logged value is a number "
        "or a one-element tensor",
        value=value,
        fix="log a float, an int or a one-element tensor",
    )


@attrs.frozen
class MetricOptions:
    """How one metric is recorded (the options of `Module.log`, resolved)."""

    prog_bar: bool
    logger: bool
    on_step: bool
    on_epoch: bool
    reduce_fx: ReduceFx
    sync_dist: bool


@attrs.define
class _Accumulator:
    options: MetricOptions
    total: Number = 0
    weight: float = 0.0
    extreme: Number | None = None

    def add(self, value: Number, weight: float) -> None:
        if self.options.reduce_fx == "mean":
            self.total += value * weight
            self.weight += weight
        elif self.options.reduce_fx == "sum":
            self.total += value
        elif self.extreme is None:
            self.extreme = value
        elif self.options.reduce_fx == "max":
            self.extreme = max(self.extreme, value)
        else:
            self.extreme = min(self.extreme, value)


class Metrics:
    """The metrics of one stage (training, validation, ...) of one epoch.

    Step values go out as they are logged; epoch values are folded by `fold`,
    on every rank at once when any metric syncs.
    """

    def __init__(self, *, stage: str, training: bool) -> None:
        self.stage = stage
        self.training = training
        self.epoch_end = False
        """Set while the epoch-end hooks run: values logged then are epoch values."""
        self._epoch: dict[str, _Accumulator] = {}
        self.step_values: dict[str, Number] = {}
        self.options: dict[str, MetricOptions] = {}

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
        batch_size: int,
        collectives: Collectives,
    ) -> None:
        """Record one value: as this step's value, and into the epoch's.

        Raises:
            ConfigurationError: The value is not a number, the name was logged with
                other options earlier in the epoch, or a step value would be synced
                outside training (where ranks may run different numbers of batches).
        """
        given: object = name  # checked as given: the user's code calls this
        if not isinstance(given, str) or not given:
            raise ConfigurationError(
                f"self.log got the name {name!r}; a metric name is a non-empty string",
                value=name,
                fix='log under a name such as "val_loss"',
            )
        if on_step and self.epoch_end:
            raise ConfigurationError(
                f"self.log({name!r}, ..., on_step=True) in an epoch-end hook, where no step runs",
                fix="drop on_step=True: values logged at the end of an epoch are epoch values",
            )
        stepwise = self.training and not self.epoch_end
        options = MetricOptions(
            prog_bar=prog_bar,
            logger=logger,
            on_step=stepwise if on_step is None else on_step,
            on_epoch=(not stepwise) if on_epoch is None else on_epoch,
            reduce_fx=reduce_fx,
            sync_dist=sync_dist,
        )
        if not (options.on_step or options.on_epoch):
            raise ConfigurationError(
                f"self.log({name!r}, ..., on_step=False, on_epoch=False) records nothing",
                fix="set on_step=True, on_epoch=True, or both",
            )
        if options.on_step and sync_dist and not self.training:
            raise ConfigurationError(
                f"self.log({name!r}, ..., on_step=True, sync_dist=True) in {self.stage}: "
                "ranks may hold different numbers of evaluation batches, so a per-step "
                "collective could wait for a rank that has finished",
                fix="log evaluation metrics per epoch (on_epoch=True, on_step=False); "
                "they are folded over ranks once, at the end",
            )
        previous = self.options.get(name)
        if previous is not None and previous != options:
            raise ConfigurationError(
                f"self.log({name!r}, ...) was called with other options earlier in this "
                f"{self.stage} epoch: {previous} then {options}",
                value=name,
                fix="log a metric with the same options every time, or give it another name",
            )
        self.options[name] = options
        number = to_number(name, value)
        if options.on_step:
            if sync_dist:
                number = collectives.reduce(number, reduce_fx)
            self.step_values[name] = number
        if options.on_epoch:
            accumulator = self._epoch.setdefault(name, _Accumulator(options))
            accumulator.add(number, float(batch_size) if reduce_fx == "mean" else 1.0)

    def start_step(self) -> None:
        """Forget the previous step's values."""
        self.step_values = {}

    def fold(self, collectives: Collectives) -> dict[str, Number]:
        """The epoch value of every metric, folded over ranks for those that sync.

        Every rank must call it at the same point: synced metrics take one
        collective for all means and sums, and one per max or min.
        """
        names = sorted(self._epoch)
        values: dict[str, Number] = {}
        synced_sums = [n for n in names if self._epoch[n].options.reduce_fx in ("mean", "sum")]
        local = [n for n in synced_sums if not self._epoch[n].options.sync_dist]
        synced = [n for n in synced_sums if self._epoch[n].options.sync_dist]
        for name in local:
            values[name] = self._value(self._epoch[name])
        if synced:
            integers = {n for n in synced if isinstance(self._epoch[n].total, int)}
            packed = torch.tensor(
                [x for n in synced for x in (float(self._epoch[n].total), self._epoch[n].weight)],
                dtype=torch.float64,
            )
            if any(abs(int(self._epoch[n].total)) >= 2**53 for n in integers):
                integers = set()  # beyond float64's exact integers: reduced as floats
            folded = collectives.reduce(packed, "sum").tolist()
            for index, name in enumerate(synced):
                total, weight = folded[2 * index], folded[2 * index + 1]
                if self._epoch[name].options.reduce_fx == "mean":
                    values[name] = total / weight if weight else math.nan
                else:
                    values[name] = int(total) if name in integers else total
        for name in names:
            accumulator = self._epoch[name]
            if accumulator.options.reduce_fx not in _EPOCH_OPS:
                continue
            value = self._value(accumulator)
            if accumulator.options.sync_dist:
                value = collectives.reduce(value, _EPOCH_OPS[accumulator.options.reduce_fx])
            values[name] = value
        return values

    @staticmethod
    def _value(accumulator: _Accumulator) -> Number:
        fx = accumulator.options.reduce_fx
        if fx == "mean":
            return accumulator.total / accumulator.weight if accumulator.weight else math.nan
        if fx == "sum":
            return accumulator.total
        assert accumulator.extreme is not None  # set by the first add
        return accumulator.extreme

    def state_dict(self) -> dict[str, object]:
        """The epoch's values so far, to resume mid-epoch (numbers only)."""
        return {
            name: {
                "options": attrs.asdict(acc.options),
                "total": acc.total,
                "weight": acc.weight,
                "extreme": acc.extreme,
            }
            for name, acc in self._epoch.items()
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore what `state_dict` returned."""
        for name, saved in state.items():
            assert isinstance(saved, Mapping)
            options = MetricOptions(**saved["options"])
            self.options[name] = options
            self._epoch[name] = _Accumulator(
                options, total=saved["total"], weight=saved["weight"], extreme=saved["extreme"]
            )

    def epoch_options(self) -> Mapping[str, MetricOptions]:
        """The options of the metrics with epoch values."""
        return {name: acc.options for name, acc in self._epoch.items()}
