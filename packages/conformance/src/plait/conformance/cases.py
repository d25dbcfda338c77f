"""What the examples are made of: dtypes, ops, tensors described as values, and `Case`.

Cases are plain frozen values (tuples, numbers, strings): they pickle cheaply to
the ranks, and their ``repr`` is the Python that rebuilds them, which is what a
reproduction snippet prints. Each kind's case type lives with its kind (the
collective contract's in `plait.conformance.kinds`, one module each); here is what
they share (`TensorSpec`, the dtypes and the ops' spellings) and the training
kit's values (`TrainingRun`, and `TrainingCase` and `StoppedCase`, which each training
example's case type builds on). What each kind of case means to a
rank and to the judge is its kind's (`plait.conformance.EXAMPLE_KINDS`).
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import attrs
from attrs import AttrsInstance
from typing_extensions import override

__all__ = [
    "COMPLEX_DTYPES",
    "DTYPES",
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "LAYOUTS",
    "MODELS",
    "MODELS_WITH_BUFFERS",
    "OPS",
    "OPTIMIZERS",
    "OP_SPELLINGS",
    "SCHEDULERS",
    "Case",
    "ModelName",
    "Number",
    "OptimizerName",
    "SchedulerName",
    "StateValue",
    "StoppedCase",
    "TensorSpec",
    "TrainingCase",
    "TrainingRun",
    "Value",
    "dtypes_of",
    "op_of",
    "spellings_of",
]

FLOAT_DTYPES: Final = ("float16", "bfloat16", "float32", "float64")
COMPLEX_DTYPES: Final = ("complex64", "complex128")
INT_DTYPES: Final = ("uint8", "int8", "int16", "int32", "int64")
DTYPES: Final = (*FLOAT_DTYPES, *COMPLEX_DTYPES, *INT_DTYPES, "bool")
"""Every dtype the contract covers, by its name in ``torch``."""

OPS: Final = ("sum", "mean", "min", "max", "product")
"""The reductions of the contract, by their names."""

_TORCH_NAMES: Final = {
    "sum": "SUM",
    "mean": "AVG",
    "min": "MIN",
    "max": "MAX",
    "product": "PRODUCT",
}


def _spellings(op: str) -> tuple[str, ...]:
    upper = op.upper()
    names = [op, upper, op.capitalize(), f" {op} "]
    if op == "mean":
        names += ["avg", "AVG", "Avg"]
    return (
        *names,
        f"plait.core.ReduceOp.{upper}",
        f"torch.distributed.ReduceOp.{_TORCH_NAMES[op]}",
    )


OP_SPELLINGS: Final[dict[str, str]] = {spelling: op for op in OPS for spelling in _spellings(op)}
"""Every spelling of a reduction the contract accepts, and the reduction it names.

A string is passed as it is written (any case, surrounding spaces, the alias
``avg``); ``"plait.core.ReduceOp.MEAN"`` and ``"torch.distributed.ReduceOp.AVG"``
stand for those enum members, which the ranks pass instead of a string.
"""


def spellings_of(op: str) -> tuple[str, ...]:
    """Every spelling of ``op`` (a name of `OPS`), its plain name first."""
    return tuple(spelling for spelling, named in OP_SPELLINGS.items() if named == op)


def op_of(spelling: str) -> str:
    """The reduction (a name of `OPS`) that ``spelling`` names."""
    return OP_SPELLINGS[spelling]


LAYOUTS: Final = ("contiguous", "transposed", "strided")
"""How a tensor sits in memory: ``transposed`` and ``strided`` are not contiguous."""

Number: TypeAlias = int | float | complex | bool
Layout: TypeAlias = Literal["contiguous", "transposed", "strided"]


@attrs.frozen
class TensorSpec:
    """A tensor as data: its dtype, shape, values in row-major order, and layout.

    Example:
        >>> TensorSpec("int64", (2,), (1, 2))
        TensorSpec('int64', (2,), (1, 2))
    """

    dtype: str = attrs.field(validator=attrs.validators.in_(DTYPES))
    shape: tuple[int, ...]
    values: tuple[Number, ...]
    layout: Layout = attrs.field(default="contiguous", validator=attrs.validators.in_(LAYOUTS))

    def __attrs_post_init__(self) -> None:
        size = 1
        for dim in self.shape:
            size *= dim
        if size != len(self.values):
            raise ValueError(f"shape {self.shape} holds {size} values, not {len(self.values)}")
        if self.layout == "transposed" and len(self.shape) < 2:
            raise ValueError("a transposed tensor needs two dimensions or more")
        if self.layout == "strided" and not self.shape:
            raise ValueError("a strided tensor needs one dimension or more")

    @override
    def __repr__(self) -> str:
        layout = "" if self.layout == "contiguous" else f", {self.layout!r}"
        return f"TensorSpec({self.dtype!r}, {self.shape!r}, {self.values!r}{layout})"

    @property
    def is_floating(self) -> bool:
        """Whether the dtype is a real floating type."""
        return self.dtype in FLOAT_DTYPES


Value: TypeAlias = TensorSpec | int | float
"""What a rank reduces: a tensor, or a Python number."""


# The training kit's examples: a small run, and what each rank does with it.

ModelName: TypeAlias = Literal["mlp", "conv", "embedding", "transformer", "norm", "attention"]
OptimizerName: TypeAlias = Literal["sgd", "adam", "lbfgs"]
SchedulerName: TypeAlias = Literal["none", "step", "epoch", "plateau"]

MODELS: Final[tuple[ModelName, ...]] = (
    "mlp",
    "conv",
    "embedding",
    "transformer",
    "norm",
    "attention",
)
MODELS_WITH_BUFFERS: Final[tuple[ModelName, ...]] = ("norm",)
"""The models whose buffers (batch normalization's running statistics) change in training."""
OPTIMIZERS: Final[tuple[OptimizerName, ...]] = ("sgd", "adam", "lbfgs")
SCHEDULERS: Final[tuple[SchedulerName, ...]] = ("none", "step", "epoch", "plateau")

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
        model: A small MLP, a convolution, an embedding bag, a transformer block,
            an MLP with batch normalization (``"norm"``: a model with buffers,
            which takes two samples or more a micro-batch), or causal self-attention
            pooled over its sequence (``"attention"``: its tokens split over
            context-parallel ranks where the strategy has them).
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

    def __attrs_post_init__(self) -> None:
        if self.model == "norm" and self.micro_batch < 2:
            raise ValueError(
                f"micro_batch={self.micro_batch}: batch normalization in training needs "
                "two samples or more a micro-batch"
            )


@attrs.frozen(hash=False)  # a round trip's holds a dict
class TrainingCase:
    """What every training example holds: a run, and the checkpoint IO it saves with.

    Each training property's examples are a subclass of their own, defined and
    registered with the property's kind (`plait.conformance.EXAMPLE_KINDS`):
    `ReplicasCase` (the declared semantics), `RoundTripCase`, `ResumeCase` and
    `MoveCase`.

    Attributes:
        run: The training run.
        checkpoint_io: The checkpoint IO (a registered name) the strategy is built
            with; None: its own.
    """

    run: TrainingRun
    checkpoint_io: str | None = attrs.field(default=None, kw_only=True)


@attrs.frozen(hash=False)
class StoppedCase(TrainingCase):
    """A training example whose run stops: it saves after ``stop_at`` optimizer steps.

    Attributes:
        stop_at: The optimizer steps taken before saving (1 to the run's steps).
    """

    stop_at: int = attrs.field(kw_only=True)

    def __attrs_post_init__(self) -> None:
        if not 0 < self.stop_at <= self.run.steps:
            raise ValueError(f"stop_at={self.stop_at} must be within the run's 1..{self.run.steps}")


Case: TypeAlias = AttrsInstance
"""Any example the ranks can run: a frozen attrs value of a registered kind.

Its ``repr`` is the Python that rebuilds it (a reproduction snippet prints it), and
it pickles to the ranks. `plait.conformance.EXAMPLE_KINDS` says what each type is.
"""


def dtypes_of(value: object) -> set[str]:
    """The dtypes of every tensor an example (or a part of one) describes."""
    if isinstance(value, TensorSpec):
        return {value.dtype}
    kind = type(value)
    if attrs.has(kind):
        return set().union(*(dtypes_of(getattr(value, f.name)) for f in attrs.fields(kind)))
    if isinstance(value, list | tuple | set | frozenset):
        return set().union(*(dtypes_of(item) for item in value))
    if isinstance(value, dict):
        return set().union(*(dtypes_of(item) for item in value.values()))
    return set()
