"""The training examples: plain frozen values, drawn by Hypothesis and sent to every rank."""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import attrs

__all__ = [
    "KINDS",
    "MODELS",
    "OPTIMIZERS",
    "SCHEDULERS",
    "Kind",
    "ModelName",
    "OptimizerName",
    "SchedulerName",
    "StateValue",
    "TrainingCase",
    "TrainingRun",
]

ModelName: TypeAlias = Literal["mlp", "conv", "embedding", "transformer"]
OptimizerName: TypeAlias = Literal["sgd", "adam", "lbfgs"]
SchedulerName: TypeAlias = Literal["none", "step", "epoch", "plateau"]
Kind: TypeAlias = Literal["replicas", "round_trip", "resume", "move_out", "move_in"]

MODELS: Final[tuple[ModelName, ...]] = ("mlp", "conv", "embedding", "transformer")
OPTIMIZERS: Final[tuple[OptimizerName, ...]] = ("sgd", "adam", "lbfgs")
SCHEDULERS: Final[tuple[SchedulerName, ...]] = ("none", "step", "epoch", "plateau")
KINDS: Final[tuple[Kind, ...]] = ("replicas", "round_trip", "resume", "move_out", "move_in")

StateValue: TypeAlias = (
    "int | float | str | bool | tuple[float, ...] | list[StateValue] | dict[int | str, StateValue]"
)
"""What a user's `Stateful` object of the examples holds: nested containers, keys of
any kind (a tuple of floats is made a tensor on the rank)."""


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name}={value} must be 1 or more")


@attrs.frozen
class TrainingRun:
    """One small training run, the same on every rank and in the reference.

    Every rank builds the model from ``seed`` and reads, at each optimizer step, its
    ``accumulate`` micro-batches of ``micro_batch`` samples out of the step's global
    batch (``accumulate * world_size * micro_batch`` samples, every rank's); each
    epoch of ``steps_per_epoch`` steps draws the samples in an order of its own.

    Attributes:
        model: A small MLP, a convolution, an embedding bag, or a transformer block.
        seed: Seeds the model, the data and the ranks' random streams.
        micro_batch: Samples in one rank's micro-batch.
        accumulate: Micro-batches per optimizer step (the first ones in ``no_sync``).
        steps: Optimizer steps in the run.
        steps_per_epoch: Optimizer steps in an epoch (epoch schedulers step at its end).
        optimizer: SGD with momentum, Adam, or LBFGS (stepped with a closure).
        scheduler: None, one stepped every step, at every epoch's end, or
            ``ReduceLROnPlateau`` on the epoch's mean loss.
        precision: The precision plugin the strategy is built with.
    """

    model: ModelName
    seed: int
    micro_batch: int = attrs.field(validator=_positive)
    accumulate: int = attrs.field(validator=_positive)
    steps: int = attrs.field(validator=_positive)
    steps_per_epoch: int = attrs.field(validator=_positive)
    optimizer: OptimizerName = "sgd"
    scheduler: SchedulerName = "none"
    precision: str = "32-true"


@attrs.frozen(hash=False)  # it holds a dict
class TrainingCase:
    """One example of a training property: a run, and what each rank does with it.

    Attributes:
        kind: ``"replicas"``: train and report the losses, the replicas after each
            step and the export; ``"round_trip"``: train, save, disturb, load, and
            compare every state (then the module alone, the load contract);
            ``"resume"``: stop at ``stop_at`` (``stop_inside`` micro-batches into the
            next window), resume in a fresh strategy, and compare with the run never
            stopped; ``"move_out"``: train to ``stop_at``, save and go on (the
            losses a moved checkpoint must go on with); ``"move_in"``: load
            ``source`` and go on from ``stop_at``.
        run: The training run.
        stop_at: The optimizer steps taken before saving (round trip, resume, moves).
        stop_inside: Micro-batches of the next window run before the stop (resume).
        checkpoint_io: The checkpoint IO (a registered name) the strategy is built
            with; None: its own.
        user_state: What the user's `Stateful` object holds (round trip).
        source: The checkpoint to load (``"move_in"``), as ``"move_out"`` wrote it.
    """

    kind: Kind
    run: TrainingRun
    stop_at: int = 0
    stop_inside: int = 0
    checkpoint_io: str | None = None
    user_state: dict[int | str, StateValue] = attrs.field(factory=dict)
    source: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind != "replicas" and not 0 < self.stop_at <= self.run.steps:
            raise ValueError(f"stop_at={self.stop_at} must be within the run's 1..{self.run.steps}")
        if not 0 <= self.stop_inside < self.run.accumulate:
            raise ValueError(
                f"stop_inside={self.stop_inside} must be below accumulate={self.run.accumulate}"
            )
