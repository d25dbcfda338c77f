"""``reduce``: every rank reduces its input; the result is the reference's, everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from typing_extensions import override

from plait.conformance import generate, grid
from plait.conformance.cases import FLOAT_DTYPES, ReduceCase, TensorSpec
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
    from hypothesis import strategies as st

    from plait.conformance.cases import Case
    from plait.conformance.kind import RankContext

__all__ = ["REDUCE_NUMBERS", "REDUCE_TENSORS", "ReduceKind", "op_labels"]


def _tensor_reduces(world_size: int) -> st.SearchStrategy[Case]:
    return generate.reduce_cases(world_size)


def _number_reduces(world_size: int) -> st.SearchStrategy[Case]:
    return generate.reduce_cases(world_size, numbers=True)


REDUCE_TENSORS: Final = Property(
    "reduce_tensors",
    "reduce(t, op) of every op and dtype, any shape (zero-size included) and layout, "
    "matches the reference on every rank, bit for bit the same everywhere, on the "
    "input's device; the mean of integers or bools is floating; the input is unchanged",
    _tensor_reduces,
    grid=grid.reduce_tensors,
)

REDUCE_NUMBERS: Final = Property(
    "reduce_numbers",
    "reduce of Python ints and floats returns a Python number of the right type "
    "(int for sum/min/max/product of ints, float otherwise) equal to the reference",
    _number_reduces,
    grid=grid.reduce_numbers,
)


class ReduceKind(CollectiveKind[ReduceCase]):
    """Every rank calls ``reduce(inputs[rank], op)``: of tensors, or of Python numbers."""

    case_type = ReduceCase
    properties = (REDUCE_TENSORS, REDUCE_NUMBERS)
    writes_results = True
    snippet_names = ("Call", "TensorSpec")

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
