"""``reduce``: every rank reduces its input; the result is the reference's, everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.cases import (
    COMPLEX_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    OP_SPELLINGS,
    OPS,
    TensorSpec,
    Value,
    op_of,
    spellings_of,
)
from plait.conformance.generate import dtypes_for, floats, int_bounds, shapes, tensor_specs
from plait.conformance.grid import (
    SHAPES_AND_LAYOUTS,
    extremes,
    float_values,
    int_extremes,
    int_values,
    per_rank,
    uneven,
)
from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.outcomes import Outcome, TensorData
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import (
    INEXACT_DTYPES,
    reference_reduce,
    same_everywhere,
    tolerance,
    within,
)
from plait.conformance.worker import reduce_op

if TYPE_CHECKING:
    from plait.conformance.cases import Case
    from plait.conformance.kind import RankContext

__all__ = [
    "REDUCE_NUMBERS",
    "REDUCE_TENSORS",
    "ReduceCase",
    "ReduceKind",
    "op_labels",
    "reduce_cases",
    "reduce_number_grid",
    "reduce_tensor_grid",
]


@attrs.frozen
class ReduceCase:
    """Every rank calls ``reduce(inputs[rank], op)``.

    ``op`` is any spelling of `OP_SPELLINGS`: ``"mean"``, ``"AVG"``, or
    ``"torch.distributed.ReduceOp.AVG"`` (the ranks pass the enum member itself).
    """

    op: str = attrs.field(validator=attrs.validators.in_(OP_SPELLINGS))
    inputs: tuple[Value, ...]

    @property
    def reduction(self) -> str:
        """The reduction ``op`` names, as one of `OPS`."""
        return op_of(self.op)


@st.composite
def reduce_cases(draw: st.DrawFn, world_size: int, *, numbers: bool = False) -> ReduceCase:
    """Every rank reduces a tensor of one dtype and shape, or (``numbers``) a Python number.

    The op comes in any spelling the contract accepts (`spellings_of`); shrinking
    leads to its plain name, so a spelling stays in a shrunk example only where the
    flaw needs it.
    """
    op = draw(st.sampled_from(OPS), label="op")
    spelling = draw(st.sampled_from(spellings_of(op)), label="spelling")
    inputs: list[Value]
    if numbers:
        if draw(st.booleans(), label="floats?"):
            number = floats("float64", op, world_size, 64)
            inputs = list(draw(st.lists(number, min_size=world_size, max_size=world_size)))
        else:
            low, high = int_bounds("int64", op, world_size)
            ints = st.integers(low, high)
            inputs = list(draw(st.lists(ints, min_size=world_size, max_size=world_size)))
        return ReduceCase(spelling, tuple(inputs))
    dtype = draw(st.sampled_from(dtypes_for(op)), label="dtype")
    shape = draw(shapes(), label="shape")
    specs = tensor_specs(dtype, shape, op=op, world_size=world_size)
    return ReduceCase(spelling, tuple(draw(specs) for _ in range(world_size)))


_SPELLING_DTYPES: Final = ("float64", "int32")
"""The dtypes every other spelling of an op is tried on: a float, and an integer
(whose mean is floating)."""


def reduce_tensor_grid(world_size: int) -> list[Case]:
    """Every op x dtype, and over each shape and layout of `SHAPES_AND_LAYOUTS`, in each spelling.

    Then every op over each integer and floating dtype at the extremes of its range.
    """
    cases: list[Case] = [
        ReduceCase(op, per_rank(dtype, op, world_size)) for op in OPS for dtype in dtypes_for(op)
    ]
    for op in OPS:
        for dtype in ("float32", "int64"):
            for shape, layout in SHAPES_AND_LAYOUTS:
                cases.append(ReduceCase(op, per_rank(dtype, op, world_size, shape, layout)))
    for op in OPS:
        for spelling in spellings_of(op)[1:]:
            cases += [
                ReduceCase(spelling, per_rank(dtype, op, world_size)) for dtype in _SPELLING_DTYPES
            ]
    cases += [
        ReduceCase(op, extremes(dtype, op, world_size))
        for op in OPS
        for dtype in (*INT_DTYPES, *FLOAT_DTYPES, *COMPLEX_DTYPES)
        if dtype in dtypes_for(op)
    ]
    return cases


def reduce_number_grid(world_size: int) -> list[Case]:
    """Every spelling of every op over Python ints and floats; ints at int64's extremes."""
    cases: list[Case] = []
    for op in OPS:
        low, high = int_bounds("int64", op, world_size)
        column = [
            int(int_values("int64", op, world_size, rank)[rank % 2]) for rank in range(world_size)
        ]
        ints: tuple[Value, ...] = tuple(uneven(column, low, high) if op == "mean" else column)
        floats: tuple[Value, ...] = tuple(
            float(float_values("float64", op, world_size, rank)[rank % 2])  # type: ignore[arg-type]
            for rank in range(world_size)
        )
        cases += [
            ReduceCase(spelling, numbers)
            for spelling in spellings_of(op)
            for numbers in (ints, floats)
        ]
        extremes = int_extremes("int64", op, world_size)
        cases.append(ReduceCase(op, tuple(pair[rank % 2] for rank, pair in enumerate(extremes))))
    return cases


def _tensor_reduces(world_size: int) -> st.SearchStrategy[Case]:
    return reduce_cases(world_size)


def _number_reduces(world_size: int) -> st.SearchStrategy[Case]:
    return reduce_cases(world_size, numbers=True)


REDUCE_TENSORS: Final = Property(
    "reduce_tensors",
    "reduce(t, op) of every op and dtype, any shape (zero-size included) and layout, "
    "matches the reference on every rank, bit for bit the same everywhere, on the "
    "input's device; the mean of integers or bools is floating; the input is unchanged",
    _tensor_reduces,
    grid=reduce_tensor_grid,
)

REDUCE_NUMBERS: Final = Property(
    "reduce_numbers",
    "reduce of Python ints and floats returns a Python number of the right type "
    "(int for sum/min/max/product of ints, float otherwise) equal to the reference",
    _number_reduces,
    grid=reduce_number_grid,
)


class ReduceKind(CollectiveKind[ReduceCase]):
    """Every rank calls ``reduce(inputs[rank], op)``: of tensors, or of Python numbers."""

    case_type = ReduceCase
    properties = (REDUCE_TENSORS, REDUCE_NUMBERS)
    writes_results = True
    snippet_names = ("TensorSpec",)

    @override
    def property_of(self, case: ReduceCase) -> Property:
        return REDUCE_TENSORS if isinstance(case.inputs[0], TensorSpec) else REDUCE_NUMBERS

    @override
    def argument(self, case: ReduceCase, rank: int) -> object:
        return case.inputs[rank]

    @override
    def call(self, context: RankContext, case: ReduceCase, argument: object) -> object:
        op = reduce_op(case.op)
        return context.strategy.reduce(argument, group=context.dimension, reduce_op=op)  # type: ignore[call-overload]

    @override
    def judge(
        self, case: ReduceCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        tensors = [value for value in case.inputs if isinstance(value, TensorSpec)]
        if tensors:
            problems = _check_tensor_reduce(case, tensors, outcomes, devices)
        else:
            numbers = [value for value in case.inputs if not isinstance(value, TensorSpec)]
            problems = _check_number_reduce(case, numbers, outcomes)
        return problems or same_everywhere(outcomes, "result")

    @override
    def labels(self, case: ReduceCase) -> dict[str, object]:
        return op_labels(case.op, case.reduction)


def op_labels(spelling: str, reduction: str) -> dict[str, object]:
    """The op, and the spelling it was written in where that is another."""
    return {"op": reduction, **({"spelling": spelling} if spelling != reduction else {})}


def _result_dtype_problem(op: str, spec: TensorSpec, dtype: str) -> str | None:  # noqa: PLR0911
    integral = spec.dtype not in INEXACT_DTYPES
    if op == "mean" and integral:
        if dtype not in FLOAT_DTYPES:
            return f"the mean of {spec.dtype} input must be floating, got {dtype}"
        return None
    if spec.dtype == "bool":
        if op == "sum" and dtype in ("bool", *INEXACT_DTYPES):
            return f"the sum of bool input must count (an integer dtype), got {dtype}"
        if dtype in INEXACT_DTYPES:
            return f"{op} of bool input must be bool or an integer dtype, got {dtype}"
        return None
    if dtype != spec.dtype:
        return f"{op} of {spec.dtype} input must keep its dtype, got {dtype}"
    return None


def _check_tensor_reduce(
    case: ReduceCase,
    inputs: Sequence[TensorSpec],
    outcomes: Sequence[Outcome],
    devices: Sequence[str],
) -> list[str]:
    first = inputs[0]
    exact = first.dtype not in INEXACT_DTYPES
    columns = list(zip(*(spec.values for spec in inputs), strict=True))
    expected = [reference_reduce(case.reduction, column, exact=exact) for column in columns]
    problems = []
    for outcome in outcomes:
        result = outcome.result
        rank = outcome.rank
        if not isinstance(result, TensorData):
            problems.append(f"rank {rank}: reduce returned {result!r}, not a tensor")
            continue
        if result.shape != first.shape:
            problems.append(f"rank {rank}: result shape {result.shape}, expected {first.shape}")
            continue
        if result.device != devices[rank]:
            problems.append(
                f"rank {rank}: result on {result.device}, expected the input's device "
                f"{devices[rank]}"
            )
        dtype_problem = _result_dtype_problem(case.reduction, first, result.dtype)
        if dtype_problem:
            problems.append(f"rank {rank}: {dtype_problem}")
            continue
        size = len(inputs)
        for index, (value, want, column) in enumerate(
            zip(result.values, expected, columns, strict=True)
        ):
            tol = tolerance(case.reduction, column, result.dtype, size)
            got = int(value) if isinstance(value, bool) else value
            if not within(got, want, tol):
                problems.append(
                    f"rank {rank}: element {index} is {value!r}, expected {want!r} "
                    f"(inputs {list(column)}, tolerance {tol:.3g})"
                )
                break
    return problems


def _check_number_reduce(
    case: ReduceCase, inputs: Sequence[int | float], outcomes: Sequence[Outcome]
) -> list[str]:
    exact = all(isinstance(value, int) for value in inputs)
    want = reference_reduce(case.reduction, inputs, exact=exact)
    want_type = float if case.reduction == "mean" or not exact else int
    tol = tolerance(case.reduction, inputs, "float64", len(inputs)) if want_type is float else 0.0
    problems = []
    for outcome in outcomes:
        got = outcome.result
        if type(got) is not want_type:
            problems.append(
                f"rank {outcome.rank}: reduce of Python {type(inputs[0]).__name__}s with "
                f"{case.op!r} must return a Python {want_type.__name__}, got {got!r}"
            )
        elif not within(got, want, tol):
            problems.append(f"rank {outcome.rank}: got {got!r}, expected {want!r}")
    return problems


EXAMPLE_KINDS.register(ReduceKind())
