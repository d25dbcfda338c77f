"""What `Module.log` records: step values as they come, epoch values folded over ranks."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

import attrs
import torch

from plait.core import CollectiveCall, CollectiveMismatchError, ConfigurationError
from plait.trainer.gather import gather_objects
from plait.trainer.metric_objects import MetricObject

if TYPE_CHECKING:
    from plait.core import Collectives, ProcessLayout
    from plait.core.typing import Group
    from plait.trainer.values import LogValue, ReduceFx

__all__ = [
    "MetricFloat",
    "MetricInt",
    "MetricOptions",
    "Metrics",
    "Number",
    "held",
    "metric_group",
    "to_number",
]

Number = float | int
"""A logged value once recorded: a Python number."""


class MetricFloat(float):
    """A logged float as ``trainer.callback_metrics`` holds it: ``.item()`` answers too.

    Lightning holds its values as tensors, and code written for it reads them with
    ``.item()``; everything else (arithmetic, comparisons, JSON) sees a float.
    """

    __slots__ = ()

    def item(self) -> float:
        """The value as a plain float (as a one-element tensor's ``item()`` gives it)."""
        return float(self)


class MetricInt(int):
    """A logged int as ``trainer.callback_metrics`` holds it: ``.item()`` answers too."""

    __slots__ = ()

    def item(self) -> int:
        """The value as a plain int."""
        return int(self)


def held(value: Number) -> Number:
    """``value`` as the callback metrics hold it (a `MetricFloat` or `MetricInt`)."""
    if isinstance(value, bool):  # a bool cannot be subclassed: it stays as it is
        return value
    return MetricInt(value) if isinstance(value, int) else MetricFloat(value)


_EPOCH_OPS: Final[dict[str, str]] = {"max": "max", "min": "min"}
_FINGERPRINT_BYTES: Final = 6  # exact in an int64, and in a float64


def _fingerprint(names: Sequence[str]) -> int:
    digest = hashlib.blake2b("\0".join(names).encode(), digest_size=_FINGERPRINT_BYTES).digest()
    return int.from_bytes(digest, "big")


def metric_group(layout: ProcessLayout) -> Group | None:
    """The group ``sync_dist`` folds values over: the ranks that hold different tokens.

    ``None`` (the whole job) where every rank reads data of its own; under tensor
    parallelism the ranks of a group compute the same values from the same batch,
    and count once: the values are folded over ``"data_parallel"`` only. Under
    context parallelism (a ``cp`` dimension in the layout) the ranks of a ``cp``
    group hold different tokens of the same batch: the values are folded over
    ``"dp_cp"``, the data- and context-parallel ranks together.
    """
    context = layout.size_of("cp")
    if layout.data_parallel_size * context == layout.world_size:
        return None
    return "dp_cp" if context > 1 else "data_parallel"


def agree_on_names(
    names: Sequence[str], what: str, collectives: Collectives, world_size: int
) -> None:
    """Check that every rank syncs the same metrics (one small collective).

    Raises:
        CollectiveMismatchError: The ranks' names differ; it names each rank's, on
            every rank, at once (instead of merging unrelated values, or waiting
            for a rank that logs nothing).
    """
    if world_size == 1:
        return
    mine = torch.tensor([_fingerprint(names), len(names)], dtype=torch.int64)
    rows = collectives.all_gather(mine)
    if bool((rows == rows[0]).all()):
        return
    # The error path only: every rank learns every rank's names.
    calls = {}
    for source, theirs in enumerate(gather_objects(collectives, list(names))):
        calls[source] = CollectiveCall(what, {"names": ", ".join(theirs) or "(none)"})
    raise CollectiveMismatchError(calls)


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
        self._pending: dict[str, tuple[Number, float]] = {}  # step values to sync
        # Metric objects logged this epoch (torchmetrics'): computed and reset at its end.
        self._objects: dict[str, tuple[MetricObject, MetricOptions]] = {}

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
        # A number or a tensor first: a protocol's isinstance is the slower check.
        if not isinstance(value, torch.Tensor | int | float) and isinstance(value, MetricObject):
            self._record_object(name, value, options)
            return
        number = to_number(name, value)
        if options.on_step and sync_dist:
            # Synced at the end of the step, all together, once the ranks agree on
            # the names (see `sync_step`).
            self._pending[name] = (number, float(batch_size) if reduce_fx == "mean" else 1.0)
            return
        if options.on_step:
            self.step_values[name] = number
        if options.on_epoch:
            accumulator = self._epoch.setdefault(name, _Accumulator(options))
            accumulator.add(number, float(batch_size) if reduce_fx == "mean" else 1.0)

    def _record_object(self, name: str, metric: MetricObject, options: MetricOptions) -> None:
        # Its batch value now; its epoch value is its own compute() at the epoch's end,
        # synced by the metric itself (sync_dist and reduce_fx do not apply).
        self._objects[name] = (metric, options)
        if not options.on_step:
            return
        # What the metric gave for the batch it was last called on (torchmetrics').
        value = getattr(metric, "_forward_cache", None)
        if value is None:
            raise ConfigurationError(
                f"self.log({name!r}, metric, on_step=True): the metric has no value for this "
                "batch, because it was updated (metric.update(...)) rather than called "
                "(metric(preds, target))",
                value=name,
                fix="call the metric on the batch (self.train_acc(preds, target)) before "
                "logging it per step, or log it per epoch only (on_step=False)",
            )
        self.step_values[name] = to_number(name, value)

    def start_step(self) -> None:
        """Forget the previous step's values.

        Synced values still waiting (logged after the step's sync, in a batch-end
        hook) are kept: they are synced with the next step's.
        """
        self.step_values = {}

    def sync_step(
        self,
        collectives: Collectives,
        world_size: int,
        *,
        required: bool,
        group: Group | None = None,
    ) -> bool:
        """Fold this step's synced values over ranks; every rank calls it after each step.

        A rank with nothing to sync takes part only when ``required`` (the first
        step of an epoch, or every step once any rank syncs step values): then a
        metric synced on some ranks only is an error at once, not a wait.

        Returns:
            Whether any rank synced step values.

        Raises:
            CollectiveMismatchError: The ranks sync different metric names.
        """
        pending = self._pending
        if not pending and (world_size == 1 or not required):
            return False  # the usual step: nothing to agree on, nothing to fold
        self._pending = {}
        names = sorted(f"{name}:{self.options[name].reduce_fx}" for name in pending)
        if world_size > 1 and (pending or required):
            agree_on_names(names, "self.log(on_step, sync_dist=True)", collectives, world_size)
        if not pending:
            return False
        ordered = sorted(pending)
        if world_size == 1:
            synced = {name: pending[name][0] for name in ordered}
        else:
            values = torch.tensor([float(pending[n][0]) for n in ordered], dtype=torch.float64)
            rows = collectives.all_gather(values, group=group)
            synced = {}
            for index, name in enumerate(ordered):
                column = rows[:, index]
                fx = self.options[name].reduce_fx
                if fx == "mean":
                    folded = column.mean()
                elif fx == "sum":
                    folded = column.sum()
                elif fx == "max":
                    folded = column.max()
                else:
                    folded = column.min()
                result = float(folded)
                whole = isinstance(pending[name][0], int) and fx != "mean"
                synced[name] = int(result) if whole and abs(result) < 2**53 else result
        for name in ordered:
            options = self.options[name]
            self.step_values[name] = synced[name]
            if options.on_epoch:
                accumulator = self._epoch.setdefault(name, _Accumulator(options))
                accumulator.add(synced[name], pending[name][1])
        return True

    def fold(
        self, collectives: Collectives, world_size: int = 1, group: Group | None = None
    ) -> dict[str, Number]:
        """The epoch value of every metric, folded over ranks for those that sync.

        Every rank must call it at the same point: the ranks first agree on the
        names they sync; then synced metrics take one collective for all means and
        sums, and one per max or min.

        Raises:
            CollectiveMismatchError: The ranks sync different metric names.
        """
        names = sorted(self._epoch)
        objects = sorted(name for name, (_, options) in self._objects.items() if options.on_epoch)
        # A metric object's compute() syncs over the ranks: every rank must call it too.
        agree_on_names(
            [
                f"{n}:{self._epoch[n].options.reduce_fx}"
                for n in names
                if self._epoch[n].options.sync_dist
            ]
            + [f"{n}:metric object" for n in objects],
            "self.log(on_epoch, sync_dist=True)",
            collectives,
            world_size,
        )
        values: dict[str, Number] = {}
        for name in objects:
            values[name] = to_number(name, self._objects[name][0].compute())
        for metric, _ in self._objects.values():
            metric.reset()  # as Lightning: each logged metric object starts the next epoch afresh
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
            folded = collectives.reduce(packed, group=group, reduce_op="sum").tolist()
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
                value = collectives.reduce(
                    value, group=group, reduce_op=_EPOCH_OPS[accumulator.options.reduce_fx]
                )
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
        objects = {name: opts for name, (_, opts) in self._objects.items() if opts.on_epoch}
        return {**objects, **{name: acc.options for name, acc in self._epoch.items()}}
