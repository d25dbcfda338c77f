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
    BarrierCase,
    BarrierTimeoutCase,
    BroadcastCase,
    Case,
    DecisionCase,
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


@_check_case.register
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
def _check_broadcast(
    case: BroadcastCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    sent = case.objects[case.src]
    problems = []
    for outcome in outcomes:
        if isinstance(sent, TensorSpec):
            problem = _check_tensor_equal(
                outcome.result,
                sent,
                rank=outcome.rank,
                shape=sent.shape,
                values=sent.values,
                device=devices[outcome.rank],
            )
            if problem:
                problems.append(problem + f" (broadcast from src={case.src})")
        elif not same_object(outcome.result, sent):
            problems.append(
                f"rank {outcome.rank}: got {_show(outcome.result)}, expected src={case.src}'s "
                f"{sent!r}"
            )
    return problems


_LAYOUT_HINTS: Final = {
    "transposed": (
        "the input is transposed (not contiguous): a gather that reads its storage in "
        "memory order gets its elements out of place; gather tensor.contiguous()"
    ),
    "strided": (
        "the input is strided (every other element of a wider tensor): a gather that "
        "reads its storage, not its elements, gets the wrong ones; gather "
        "tensor.contiguous()"
    ),
}


def _rows_problem(rank: int, got: TensorData, inputs: Sequence[TensorSpec]) -> str:
    """Row by row, what a rank's gathered rows hold against each rank's tensor."""
    first = inputs[0]
    size = len(first.values)
    rows = [got.values[index * size : (index + 1) * size] for index in range(len(inputs))]
    wanted: list[tuple[object, ...]] = [spec.values for spec in inputs]
    layouts = sorted({spec.layout for spec in inputs})
    lines = [
        (
            f"rank {rank}: all_gather of {first.dtype} tensors of shape {first.shape} "
            f"({', '.join(layouts)}): rows that differ from the ranks' tensors:"
        )
    ]
    for index, (row, want) in enumerate(zip(rows, wanted, strict=True)):
        if row != want:
            lines.append(
                f"    row {index}: got {shown(row)}, expected rank {index}'s {shown(want)}"
            )
    holders = [wanted.index(row) if row in wanted else None for row in rows]
    if all(holder is not None for holder in holders) and holders != list(range(len(rows))):
        lines.append(
            f"    every row is some rank's tensor, out of order: rows 0 to {len(rows) - 1} "
            f"hold the tensors of ranks {holders}"
        )
    else:
        hints = [_LAYOUT_HINTS[layout] for layout in layouts if layout in _LAYOUT_HINTS]
        lines += [f"    {hint}" for hint in hints]
    return "\n".join(lines)


@_check_case.register
def _check_all_gather(
    case: AllGatherCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    first = case.inputs[0]
    shape = (len(case.inputs), *first.shape)
    values = tuple(value for spec in case.inputs for value in spec.values)
    problems = []
    for outcome in outcomes:
        result = outcome.result
        problem = _check_tensor_equal(
            result,
            first,
            rank=outcome.rank,
            shape=shape,
            values=values,
            device=devices[outcome.rank],
        )
        comparable = (
            isinstance(result, TensorData)
            and result.shape == shape
            and result.dtype == first.dtype
            and result.device == devices[outcome.rank]
        )
        if problem and comparable:
            problem = _rows_problem(outcome.rank, result, case.inputs)  # type: ignore[arg-type]
        if problem:
            problems.append(problem)
    return problems


@_check_case.register
def _check_decision(
    case: DecisionCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    want = all(case.decisions) if case.all else any(case.decisions)
    return [
        f"rank {outcome.rank}: got {outcome.result!r}, expected {want} "
        f"({'all' if case.all else 'any'} of {list(case.decisions)})"
        for outcome in outcomes
        if outcome.result is not want
    ]


@_check_case.register
def _check_barrier(
    case: BarrierCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    size = len(outcomes)
    return [
        f"rank {outcome.rank} left the barrier when only {outcome.entered} of {size} ranks "
        f"had entered (rank {case.late_rank} came {case.delay_ms} ms late)"
        for outcome in outcomes
        if outcome.entered != size
    ]


@_check_case.register
def _check_barrier_timeout(
    case: BarrierTimeoutCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    problems = []
    for outcome in outcomes:
        if outcome.rank == case.absent_rank:
            continue
        error = outcome.error
        if error is None or "CollectiveTimeoutError" not in error.kinds:
            problems.append(
                f"rank {outcome.rank}: barrier(timeout={case.timeout}) without rank "
                f"{case.absent_rank} must raise CollectiveTimeoutError, got "
                f"{error.describe() if error else repr(outcome.result)}"
            )
        elif case.absent_rank not in (error.missing_ranks or ()):
            problems.append(
                f"rank {outcome.rank}: the timeout names missing ranks {error.missing_ranks}, "
                f"not rank {case.absent_rank}"
            )
    return problems


def _partition(pairs: Sequence[tuple[int, object]]) -> set[frozenset[int]]:
    groups: dict[object, set[int]] = {}
    for rank, key in pairs:
        groups.setdefault(key, set()).add(rank)
    return {frozenset(ranks) for ranks in groups.values()}


@_check_case.register
def _check_mismatch(
    case: MismatchCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    want = _partition(list(enumerate(case.calls)))
    problems = []
    for outcome in outcomes:
        error = outcome.error
        if error is None or "CollectiveMismatchError" not in error.kinds:
            got = error.describe() if error else f"returned {_show(outcome.result)}"
            problems.append(f"rank {outcome.rank}: must raise CollectiveMismatchError, {got}")
            continue
        calls = error.calls or ()
        if sorted(rank for rank, _ in calls) != list(range(len(case.calls))):
            problems.append(
                f"rank {outcome.rank}: the error names the calls of ranks "
                f"{sorted(rank for rank, _ in calls)}, not of every rank"
            )
        elif _partition(calls) != want:
            problems.append(
                f"rank {outcome.rank}: the error groups the ranks as "
                f"{sorted(sorted(group) for group in _partition(calls))}, but they called "
                f"{sorted(sorted(group) for group in want)}"
            )
    return problems


@_check_case.register
def _check_bad_argument(
    case: BadArgumentCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    problems = []
    call = f"{case.collective}({case.argument}={case.value!r})"
    for outcome in outcomes:
        error = outcome.error
        if error is None or case.expected not in error.kinds:
            got = error.describe() if error else f"returned {_show(outcome.result)}"
            problems.append(f"rank {outcome.rank}: {call} must raise {case.expected}, {got}")
            continue
        named = type(case.value).__name__ if case.expected == "TypeError" else str(case.value)
        if named not in error.message:
            problems.append(
                f"rank {outcome.rank}: the {error.type_name} of {call} does not name "
                f"{named!r}: {error.message!r}"
            )
    return problems


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
