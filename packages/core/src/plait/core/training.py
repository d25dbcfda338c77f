"""What a strategy promises about training, as a value the conformance kit reads.

A strategy declares its `TrainingSemantics` (`DeclaresTrainingSemantics`), and
``plait.conformance`` proves the declaration on small drawn models: that its
replicas stay as the declaration says, that checkpoints round-trip and resume
exactly, and that its checkpoints move to the strategies it names. A strategy that
declares nothing is held to the default: `Synchronous` replicas.

A value of this module is plain data, frozen and validated when made; the one
exception is an outer optimizer's factories (`PeriodicAveraging.outer_optimizer`),
module-level functions that travel to the ranks by name. The module imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias, TypeVar, runtime_checkable

import attrs

from plait.core.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

__all__ = [
    "BUFFERS",
    "Buffers",
    "DeclaresTrainingSemantics",
    "OuterOptimizer",
    "OuterScheduler",
    "PeriodicAveraging",
    "Replicas",
    "Synchronous",
    "TrainingSemantics",
    "Validates",
    "training_semantics_of",
]


@attrs.frozen
class Synchronous:
    """Gradients are averaged over the data-parallel ranks at every optimizer step.

    So ``N`` steps at world size ``W`` equal ``N`` steps of one process on the global
    batch (every rank's micro-batches of the step, accumulation windows included),
    within the rounding of the precision, with any optimizer, and the replicas are
    identical after every step.
    """


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"{name}={value!r} must be a whole number of steps, 1 or more",
            value=value,
            fix=f"pass e.g. {name}=4",
        )


def _every(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    _positive(attribute.name, value)


def _non_negative(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigurationError(
            f"{attribute.name}={value!r} must be a number, 0 or more",
            value=value,
            fix=f"pass e.g. {attribute.name}=0.9",
        )


Validates: TypeAlias = Literal["replicas", "mean", "anchor"]
"""What the ranks of a `PeriodicAveraging` strategy validate."""

VALIDATES: tuple[Validates, ...] = ("replicas", "mean", "anchor")


def _validates(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in VALIDATES:
        raise ConfigurationError.invalid_choice(attribute.name, value, VALIDATES)


OuterOptimizer: TypeAlias = "Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]"
"""A factory of an outer optimizer over the anchor's parameters."""

OuterScheduler: TypeAlias = (
    "Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]"
)
"""A factory of a scheduler of the outer optimizer."""


_F = TypeVar("_F")


def _factory(_: object, attribute: attrs.Attribute[_F], value: _F) -> None:
    if value is not None and not callable(value):
        raise ConfigurationError(
            f"{attribute.name}={value!r} must be a factory (a module-level function)",
            value=value,
            fix=f"pass e.g. {attribute.name}=make_outer_optimizer, a function of your "
            "module that builds it",
        )


def _periods(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen
class PeriodicAveraging:
    """Each replica steps its own optimizer on its own data; every ``every`` steps they meet.

    Local SGD, and DiLoCo with an outer optimizer: between meetings a replica's
    module and optimizer are its own (its rank's data, no synchronisation). At each
    ``every``-th step, and at the end of training (`on_train_end`, over what is left
    of a period), the replicas start again from one module: the last meeting's
    module minus an outer SGD step whose gradient is the replicas' mean change since
    it, ``anchor - outer_lr * update``, with ``momentum``/``nesterov`` as
    `torch.optim.SGD` takes them. With the defaults (``outer_lr=1``, no momentum)
    that is the mean of the replicas' modules.

    Another outer optimizer (Adam, weight decay, a schedule) is declared by
    ``outer_optimizer``: a factory that takes the anchor's tensors, as parameters,
    and returns the optimizer, made once for the run; at each meeting every anchor
    parameter's gradient is the replicas' mean change since the last meeting
    (``anchor - mean``), the optimizer steps, and ``outer_scheduler`` (a factory of
    a scheduler of that optimizer), where given, steps after it. Both are
    module-level functions (they travel to the ranks by name and compare equal
    there).

    Validation (between ``on_validation_start`` and ``on_validation_end``) sees
    the module ``validates`` names, and training goes on from the replicas as they
    were.

    Attributes:
        every: The optimizer steps between meetings.
        outer_lr: The outer optimizer's learning rate.
        outer_momentum: Its momentum (0 for none).
        nesterov: Whether its momentum is Nesterov's.
        validates: What each rank validates: ``"replicas"`` its own replica (the
            hooks change nothing), ``"mean"`` the replicas' mean, ``"anchor"`` the
            last meeting's module.
        outer_optimizer: Instead of the outer SGD of ``outer_lr``,
            ``outer_momentum`` and ``nesterov``, the factory of the outer optimizer.
        outer_scheduler: The factory of the outer optimizer's scheduler, stepped
            after each outer step.
        fragments: Streaming synchronisation: the parameters (in ``parameters()``
            order) split into this many fragments (`fragment`), each meeting every
            ``every`` steps, staggered over the period (`meets`), each with its own
            part of the anchor and of the outer optimizer's step; at the end of
            training every fragment that did not just meet meets.
        periods: A period per parameter group: the parameters (in ``parameters()``
            order) split into ``len(periods)`` groups as fragments are
            (`fragment`), group ``i`` meeting every ``periods[i]`` steps (`meets`),
            each over its own part of the anchor and of the outer step; ``every``
            is the longest of them. At the end of training every group that did
            not just meet meets.

    Raises:
        ConfigurationError: ``outer_optimizer`` is given with an outer SGD setting
            other than its default, ``outer_scheduler`` without ``outer_optimizer``,
            either is not callable, ``fragments`` is more than ``every``, or
            ``periods`` is given with ``fragments``, holds a period that is not a
            whole number of steps, or its longest is not ``every``.
    """

    every: int = attrs.field(validator=_every)
    outer_lr: float = attrs.field(default=1.0, validator=_non_negative)
    outer_momentum: float = attrs.field(default=0.0, validator=_non_negative)
    nesterov: bool = False
    validates: Validates = attrs.field(default="replicas", validator=_validates)
    outer_optimizer: OuterOptimizer | None = attrs.field(default=None, validator=_factory)
    outer_scheduler: OuterScheduler | None = attrs.field(default=None, validator=_factory)
    fragments: int = attrs.field(default=1, validator=_every)
    periods: tuple[int, ...] = attrs.field(default=(), converter=_periods)

    @property
    def parts(self) -> int:
        """How many parts the parameters meet in: the groups of `periods`, or `fragments`."""
        return len(self.periods) or self.fragments

    def fragment(self, index: int, count: int) -> int:
        """The part of the ``index``-th of ``count`` parameters (in ``parameters()`` order).

        The parameters are split in order into `parts` runs of as even a length as
        can be: the fragments, or the groups of `periods`.
        """
        return index * self.parts // count

    def meets(self, fragment: int, steps: int) -> bool:
        """Whether part ``fragment`` meets once ``steps`` optimizer steps are taken.

        With `periods`, group ``i`` meets every ``periods[i]`` steps. Otherwise
        fragment ``i`` meets every ``every`` steps, ``i * every // fragments`` steps
        after the first fragment: its meetings are staggered over the period.
        """
        if self.periods:
            return steps > 0 and steps % self.periods[fragment] == 0
        return steps > 0 and steps % self.every == fragment * self.every // self.fragments

    def __attrs_post_init__(self) -> None:
        for period in self.periods:
            _positive("periods", period)
        if self.periods and self.fragments > 1:
            raise ConfigurationError(
                f"periods={self.periods} gives each parameter group a period of its "
                f"own, and fragments={self.fragments} staggers one period over fragments",
                value=self.periods,
                fix="declare one of them: periods=(...) or fragments=...",
            )
        if self.periods and max(self.periods) != self.every:
            raise ConfigurationError(
                f"periods={self.periods} with every={self.every}: every is the longest "
                "period, the one the runs are drawn against",
                value=self.every,
                fix=f"pass every={max(self.periods)}",
            )
        if self.fragments > self.every:
            raise ConfigurationError(
                f"fragments={self.fragments} staggers the meetings over a period of "
                f"every={self.every} steps, and two fragments would meet at once",
                value=self.fragments,
                fix=f"pass fragments={self.every} or fewer, or a longer period",
            )
        if self.outer_optimizer is not None and (
            self.outer_lr != 1 or self.outer_momentum or self.nesterov
        ):
            raise ConfigurationError(
                "outer_optimizer= declares the outer step, and so do outer_lr="
                f"{self.outer_lr!r}, outer_momentum={self.outer_momentum!r}, "
                f"nesterov={self.nesterov!r}",
                value=self.outer_optimizer,
                fix="give the outer optimizer its learning rate and momentum in the "
                "factory, and leave outer_lr, outer_momentum and nesterov out",
            )
        if self.outer_scheduler is not None and self.outer_optimizer is None:
            raise ConfigurationError(
                "outer_scheduler= schedules an outer optimizer, and no outer_optimizer= is given",
                value=self.outer_scheduler,
                fix="pass outer_optimizer=, a factory of the outer optimizer, too",
            )


Replicas: TypeAlias = Synchronous | PeriodicAveraging
"""How a strategy's data-parallel replicas relate from step to step."""

Buffers: TypeAlias = Literal["broadcast", "own"]
"""What becomes of a module's buffers (BatchNorm's running statistics) across ranks."""

BUFFERS: tuple[Buffers, ...] = ("broadcast", "own")
"""The ways a strategy may declare its buffers (`TrainingSemantics.buffers`)."""


def _names(value: Iterable[str]) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value)
    if isinstance(value, str) or not all(isinstance(name, str) for name in names):
        raise ConfigurationError(
            f"{value!r} must be a sequence of names, not a string or other values",
            value=value,
            fix='pass a tuple of names, e.g. ("ddp", "fsdp") or ("32-true", "bf16-mixed")',
        )
    return names


def _replicas(_: object, attribute: attrs.Attribute[Replicas], value: object) -> None:
    if not isinstance(value, Synchronous | PeriodicAveraging):
        raise ConfigurationError(
            f"replicas={value!r} is not a way replicas can relate",
            value=value,
            choices=("Synchronous()", "PeriodicAveraging(every=...)"),
            fix="pass Synchronous() or PeriodicAveraging(every=4)",
        )


@attrs.frozen
class TrainingSemantics:
    """A strategy's promises about training, each checked by ``plait.conformance``.

    Attributes:
        replicas: How the data-parallel replicas relate: `Synchronous` (the
            default) or `PeriodicAveraging`.
        compatible: Registered strategies that a checkpoint of this one moves to
            at the same world size: loaded there, training goes on with this
            strategy's losses (within the precision's rounding).
        exact_resume: Whether a run stopped at any step and resumed from its
            checkpoint gives the losses and weights of the run never stopped bit
            for bit (otherwise within the precision's rounding).
        precisions: The precision plugins (by name) the kit may build the
            strategy with, through ``replace(precision=...)``.
        resizable: Whether a checkpoint saved at one world size resumes at
            another: the module, optimizers and schedulers load there, and training
            goes on as the declaration says at the new world size (synchronous
            replicas: one process on the new global batch from the saved state).
        parallelized_by_module: Whether a module parallelizes itself over the
            strategy's ``device_mesh`` before ``setup_module`` (the strategy checks
            it and never guesses a plan, as ``ModelParallelStrategy``): the kit's
            models then split their layers over the mesh's ``"tp"`` dimension, where
            it has one, and ``fully_shard`` themselves over the strategy's
            ``data_parallel_mesh``, and each rank reads the data of its
            ``layout.data_parallel_rank``.
        buffers: What becomes of the module's buffers (BatchNorm's running
            statistics), which each rank updates in training from its own
            micro-batches: ``"broadcast"`` (each window of an optimizer step starts
            from rank 0's buffers, as ``DistributedDataParallel`` broadcasts them
            with ``broadcast_buffers=True``), or ``"own"`` (each rank keeps its own,
            never exchanged: FSDP, local SGD). None (the default): ``"broadcast"``
            for synchronous replicas, ``"own"`` for periodic averaging (`buffer_updates`).
            Either way a checkpoint holds rank 0's buffers, and every rank loads them.

    Raises:
        ConfigurationError: ``resizable`` is declared for replicas that are not
            synchronous (each rank's replica has no place at another world size), a
            ``buffers`` that is none of `BUFFERS`, or ``"broadcast"`` declared with
            periodic averaging.
    """

    replicas: Replicas = attrs.field(factory=Synchronous, validator=_replicas)
    compatible: tuple[str, ...] = attrs.field(default=(), converter=_names)
    exact_resume: bool = True
    precisions: tuple[str, ...] = attrs.field(default=("32-true",), converter=_names)
    resizable: bool = False
    parallelized_by_module: bool = False
    buffers: Buffers | None = None

    @property
    def buffer_updates(self) -> Buffers:
        """What becomes of the buffers: `buffers`, or the replicas' default."""
        if self.buffers is not None:
            return self.buffers
        return "broadcast" if isinstance(self.replicas, Synchronous) else "own"

    def __attrs_post_init__(self) -> None:
        if self.buffers is not None and self.buffers not in BUFFERS:
            raise ConfigurationError.invalid_choice("buffers", self.buffers, BUFFERS)
        if self.buffers == "broadcast" and not isinstance(self.replicas, Synchronous):
            raise ConfigurationError(
                f"buffers='broadcast' is declared with {self.replicas!r}: replicas that "
                "train on their own keep their own buffers between meetings",
                value=self.buffers,
                fix="declare buffers='own' (the default for periodic averaging)",
            )
        if self.resizable and not isinstance(self.replicas, Synchronous):
            raise ConfigurationError(
                f"resizable=True is declared with {self.replicas!r}: replicas that each "
                "train on their own have no place at another world size",
                value=self.replicas,
                fix="declare resizable=False, or resize only synchronous replicas",
            )


@runtime_checkable
class DeclaresTrainingSemantics(Protocol):
    """A strategy that says what it promises about training (see `TrainingSemantics`)."""

    @property
    def training_semantics(self) -> TrainingSemantics:
        """Its promises."""
        ...


def training_semantics_of(strategy: object) -> TrainingSemantics:
    """What ``strategy`` declares, or the default (`Synchronous`) where it declares nothing.

    Raises:
        ConfigurationError: It declares something other than a `TrainingSemantics`.
    """
    if not isinstance(strategy, DeclaresTrainingSemantics):
        return TrainingSemantics()
    declared = strategy.training_semantics
    if not isinstance(declared, TrainingSemantics):
        raise ConfigurationError(
            f"{type(strategy).__name__}.training_semantics is {declared!r}, not a "
            "plait.core.TrainingSemantics",
            value=declared,
            fix="return TrainingSemantics(replicas=...) from the property",
        )
    return declared
