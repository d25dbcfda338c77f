"""``reduce``: every rank reduces its input; the result is the reference's, everywhere."""

from __future__ import annotations

from collections.abc import Sequence

from plait.conformance.cases import FLOAT_DTYPES, ReduceCase, TensorSpec
from plait.conformance.outcomes import Outcome, TensorData
from plait.conformance.spec import (
    _INEXACT,
    _check_case,
    _close,
    _same_everywhere,
    reference_reduce,
    tolerance,
)
from plait.conformance.worker import _Context, invoke, reduce_op

__all__: list[str] = []


@invoke.register(ReduceCase)
def _invoke_reduce(case: ReduceCase, context: _Context, argument: object) -> tuple[object, None]:
    strategy = context.strategy
    group = context.dimension
    op = reduce_op(case.op)
    return strategy.reduce(argument, group=group, reduce_op=op), None  # type: ignore[call-overload]


def _result_dtype_problem(op: str, spec: TensorSpec, dtype: str) -> str | None:  # noqa: PLR0911
    integral = spec.dtype not in _INEXACT
    if op == "mean" and integral:
        if dtype not in FLOAT_DTYPES:
            return f"the mean of {spec.dtype} input must be floating, got {dtype}"
        return None
    if spec.dtype == "bool":
        if op == "sum" and dtype in ("bool", *_INEXACT):
            return f"the sum of bool input must count (an integer dtype), got {dtype}"
        if dtype in _INEXACT:
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
    exact = first.dtype not in _INEXACT
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
            if not _close(got, want, tol):
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
        elif not _close(got, want, tol):
            problems.append(f"rank {outcome.rank}: got {got!r}, expected {want!r}")
    return problems


@_check_case.register(ReduceCase)
def _check_reduce(
    case: ReduceCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    tensors = [value for value in case.inputs if isinstance(value, TensorSpec)]
    if tensors:
        problems = _check_tensor_reduce(case, tensors, outcomes, devices)
    else:
        numbers = [value for value in case.inputs if not isinstance(value, TensorSpec)]
        problems = _check_number_reduce(case, numbers, outcomes)
    return problems or _same_everywhere(outcomes, "result")
