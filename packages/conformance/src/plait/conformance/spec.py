"""The reference semantics: what every rank must get, computed in one process.

Given every rank's input, each function here computes the contract's result in
plain Python (exact integer arithmetic, correctly rounded float sums) and lists
how the ranks' real outcomes differ from it. An empty list means the example
keeps the contract.

Floating-point results are compared with a tolerance that follows from the op
and dtype: ranks may sum in any order, so a sum over ``n`` ranks may be off by
``n`` roundings of the magnitudes summed. Everything else is compared exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Final

import attrs

from plait.conformance.cases import (
    COMPLEX_DTYPES,
    FLOAT_DTYPES,
    AllGatherCase,
    BadArgumentCase,
    BarrierTimeoutCase,
    BroadcastCase,
    Case,
    GroupCase,
    MismatchCase,
    Number,
    ReduceCase,
    TensorSpec,
    TrainingCase,
)
from plait.conformance.outcomes import Outcome, TensorData, shown

__all__ = ["check", "failing_parts", "reference_reduce", "same_object", "tolerance"]

_EPS: Final = {
    "float16": 2.0**-10,
    "bfloat16": 2.0**-7,
    "float32": 2.0**-23,
    "float64": 2.0**-52,
    "complex64": 2.0**-23,
    "complex128": 2.0**-52,
}
"""Machine epsilon of each inexact dtype."""

_TINY: Final = {
    "float16": 2.0**-14,
    "bfloat16": 2.0**-126,
    "float32": 2.0**-126,
    "float64": 2.0**-1022,
    "complex64": 2.0**-126,
    "complex128": 2.0**-1022,
}
"""The smallest normal number of each inexact dtype: products may underflow to it."""

_INEXACT: Final = (*FLOAT_DTYPES, *COMPLEX_DTYPES)


def _fsum(values: Sequence[Number]) -> Number:
    if any(isinstance(value, complex) for value in values):
        return complex(
            math.fsum(complex(value).real for value in values),
            math.fsum(complex(value).imag for value in values),
        )
    return math.fsum(float(value) for value in values if not isinstance(value, complex))


def reference_reduce(op: str, column: Sequence[Number], *, exact: bool) -> Number:
    """The reduction of one element across ranks (``column[rank]``).

    Args:
        op: ``"sum"``, ``"mean"``, ``"min"``, ``"max"`` or ``"product"``.
        column: Each rank's value of the element.
        exact: The values are integers or bools: sum and product stay integers.
    """
    values = [int(value) if isinstance(value, bool) else value for value in column]
    if op == "sum":
        return sum(values) if exact else _fsum(values)
    if op == "mean":
        total = sum(values) if exact else _fsum(values)
        return total / len(values)
    if op == "product":
        return math.prod(values)
    real = [value for value in values if not isinstance(value, complex)]
    return min(real) if op == "min" else max(real)


def tolerance(op: str, column: Sequence[Number], dtype: str, world_size: int) -> float:
    """How far a correct result of ``dtype`` may be from the exact one.

    Sums and means may be off by one rounding per rank of the magnitudes summed
    (plus one for the division of a mean); products by one rounding per rank,
    relative to the product, or underflow. Integer results, minima and maxima are
    exact.
    """
    if dtype not in _INEXACT or op in ("min", "max"):
        return 0.0
    eps = _EPS[dtype]
    magnitudes = [abs(complex(value)) for value in column]
    if op == "product":
        return (world_size + 1) * eps * math.prod(magnitudes) + 2 * _TINY[dtype]
    return (world_size + 1) * eps * math.fsum(magnitudes) + _TINY[dtype]


def _close(actual: object, expected: Number, tol: float) -> bool:
    if not isinstance(actual, int | float | complex):
        return False
    if isinstance(actual, float | complex) and not math.isfinite(abs(actual)):
        return False
    if tol == 0.0:
        return actual == expected
    return abs(complex(actual) - complex(expected)) <= tol


@functools.singledispatch
def _check_case(case: object, outcomes: Sequence[Outcome], devices: Sequence[str]) -> list[str]:
    raise TypeError(f"no reference semantics for {type(case).__name__}")


def _value(result: object) -> object:
    # What must agree across ranks: not the device, which is each rank's own.
    if isinstance(result, TensorData):
        return (result.dtype, result.shape, result.values)
    return result


def _same_everywhere(outcomes: Sequence[Outcome], what: str) -> list[str]:
    first = outcomes[0].result
    return [
        f"rank {outcome.rank} got a different {what} from rank 0: "
        f"{_show(outcome.result)} != {_show(first)}"
        for outcome in outcomes[1:]
        if _value(outcome.result) != _value(first)
    ]


def _show(value: object) -> str:
    return value.describe() if isinstance(value, TensorData) else repr(value)


def same_object(actual: object, expected: object) -> bool:
    """Equal values of the same types, all the way down (``1 == 1.0 == True`` is not enough)."""
    if type(actual) is not type(expected):
        return False
    if isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple)
        return len(actual) == len(expected) and all(
            same_object(a, e) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(expected, dict):
        assert isinstance(actual, dict)
        return list(actual) == list(expected) and all(
            same_object(actual[key], value) for key, value in expected.items()
        )
    return actual == expected


def _check_tensor_equal(
    got: object,
    want: TensorSpec,
    *,
    rank: int,
    shape: tuple[int, ...],
    values: tuple[object, ...],
    device: str,
) -> str | None:
    if not isinstance(got, TensorData):
        return f"rank {rank}: got {got!r}, not a tensor"
    if got.dtype != want.dtype or got.shape != shape:
        return (
            f"rank {rank}: got dtype {got.dtype} shape {got.shape}, expected {want.dtype} {shape}"
        )
    if got.device != device:
        return f"rank {rank}: tensor on {got.device}, expected its root_device {device}"
    if got.values != values:
        return f"rank {rank}: got {shown(got.values)}, expected {shown(values)}"
    return None


@_check_case.register
def _check_group(case: GroupCase, outcomes: Sequence[Outcome], devices: Sequence[str]) -> list[str]:
    # Among the members, each collective keeps the contract as over the whole job
    # (the members' inputs only, rows in the members' order); outside, a call with
    # the group is refused.
    problems = []
    for outcome in outcomes:
        error = outcome.error
        if outcome.rank in case.members:
            if error is not None:
                problems.append(
                    f"rank {outcome.rank} (in the group {list(case.members)}) raised "
                    f"{error.describe()}\n{error.traceback}"
                )
        elif error is None or "ValueError" not in error.kinds:
            got = error.describe() if error else f"returned {_show(outcome.result)}"
            problems.append(
                f"rank {outcome.rank} is not in the group {list(case.members)}: its reduce "
                f"over the group must raise ValueError, {got}"
            )
    if problems:
        return problems
    parts = _group_parts(case, outcomes)
    if isinstance(parts, str):
        return [parts]
    within = f" (over the group of ranks {list(case.members)})"
    return [
        problem + within
        for _, example, part in parts
        for problem in _check_case(example, part, devices)
    ]


_GROUP_PARTS: Final = ("reduce_tensors", "all_gather", "broadcast")
"""What each member of a sub-group example returns, in order, by the property that
proves that collective over the whole job."""


def _group_parts(
    case: GroupCase, outcomes: Sequence[Outcome]
) -> list[tuple[str, Case, list[Outcome]]] | str:
    """Each collective of a sub-group example as an example of its own among the members.

    For each: the property that proves it over the whole job, the example (the
    members' inputs only), and the members' outcomes of it; or why the members'
    results cannot be split so.
    """
    members = [outcomes[rank] for rank in case.members]
    for outcome in members:
        result = outcome.result
        if not isinstance(result, tuple) or len(result) != len(_GROUP_PARTS):
            return f"rank {outcome.rank}: the worker's results are malformed: {result!r}"
    inputs = tuple(case.inputs[rank] for rank in case.members)
    examples: tuple[Case, ...] = (
        ReduceCase(case.op, inputs),
        AllGatherCase(inputs),
        BroadcastCase(case.src, case.inputs),
    )
    return [
        (
            name,
            example,
            [attrs.evolve(outcome, result=outcome.result[index]) for outcome in members],  # type: ignore[index]
        )
        for index, (name, example) in enumerate(zip(_GROUP_PARTS, examples, strict=True))
    ]


def failing_parts(
    case: GroupCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> tuple[str, ...]:
    """Which collectives of a sub-group example broke the contract, by property.

    Each is named by the property that proves it over the whole job:
    ``reduce_tensors``, ``all_gather``, ``broadcast``. Empty where the example
    failed otherwise (a member raised, or its results are malformed).
    """
    if any(outcomes[rank].error is not None for rank in case.members):
        return ()
    parts = _group_parts(case, outcomes)
    if isinstance(parts, str):
        return ()
    return tuple(name for name, example, part in parts if _check_case(example, part, devices))


_RAISING: Final = (BarrierTimeoutCase, MismatchCase, BadArgumentCase, GroupCase)


def check(case: Case, outcomes: Sequence[Outcome], devices: Sequence[str]) -> list[str]:
    """How the ranks' outcomes of ``case`` break the contract; empty if they keep it.

    Args:
        case: The example every rank ran.
        outcomes: Each rank's outcome, in rank order.
        devices: Each rank's ``root_device``, as text.
    """
    problems = [
        f"rank {outcome.rank} changed its input: {outcome.mutated}"
        for outcome in outcomes
        if outcome.mutated
    ]
    problems += [
        f"rank {outcome.rank}: {outcome.aliased} (a result must be the caller's own)"
        for outcome in outcomes
        if outcome.aliased
    ]
    if not isinstance(case, _RAISING):
        errors = [
            f"rank {outcome.rank} raised {outcome.error.describe()}\n{outcome.error.traceback}"
            for outcome in outcomes
            if outcome.error is not None
        ]
        if errors:
            return problems + errors
    return problems + _check_case(case, outcomes, devices)


@_check_case.register
def _check_training(
    case: TrainingCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    from plait.conformance.training.reference import check_training  # noqa: PLC0415 - lazily

    del devices  # every rank's run is on its own device; the reports say the rest
    return check_training(case, outcomes)
