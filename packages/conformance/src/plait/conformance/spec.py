"""The reference semantics: what every rank must get, computed in one process.

Given every rank's input, the contract's result is computed here in plain Python
(exact integer arithmetic, correctly rounded float sums); `check` lists how the
ranks' real outcomes differ from it, through the judge of the example's kind
(`plait.conformance.kinds`), which these functions serve. An empty list means the
example keeps the contract.

Floating-point results are compared with a tolerance that follows from the op
and dtype: ranks may sum in any order, so a sum over ``n`` ranks may be off by
``n`` roundings of the magnitudes summed. Everything else is compared exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from plait.conformance.cases import COMPLEX_DTYPES, FLOAT_DTYPES, Number, TensorSpec
from plait.conformance.outcomes import Outcome, TensorData, shown
from plait.conformance.registry import EXAMPLE_KINDS

if TYPE_CHECKING:
    from plait.conformance.cases import Case

__all__ = [
    "INEXACT_DTYPES",
    "check",
    "failing_parts",
    "reference_reduce",
    "same_everywhere",
    "same_object",
    "show",
    "tensor_problem",
    "tolerance",
    "within",
]

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

INEXACT_DTYPES: Final = (*FLOAT_DTYPES, *COMPLEX_DTYPES)
"""The dtypes whose results may be off by rounding."""


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
    if dtype not in INEXACT_DTYPES or op in ("min", "max"):
        return 0.0
    eps = _EPS[dtype]
    magnitudes = [abs(complex(value)) for value in column]
    if op == "product":
        return (world_size + 1) * eps * math.prod(magnitudes) + 2 * _TINY[dtype]
    return (world_size + 1) * eps * math.fsum(magnitudes) + _TINY[dtype]


def within(actual: object, expected: Number, tol: float) -> bool:
    """Whether ``actual`` is a finite number within ``tol`` of ``expected`` (equal, at 0)."""
    if not isinstance(actual, int | float | complex):
        return False
    if isinstance(actual, float | complex) and not math.isfinite(abs(actual)):
        return False
    if tol == 0.0:
        return actual == expected
    return abs(complex(actual) - complex(expected)) <= tol


def _value(result: object) -> object:
    # What must agree across ranks: not the device, which is each rank's own.
    if isinstance(result, TensorData):
        return (result.dtype, result.shape, result.values)
    return result


def same_everywhere(outcomes: Sequence[Outcome], what: str) -> list[str]:
    """A problem for each rank whose result differs from rank 0's (devices aside)."""
    first = outcomes[0].result
    return [
        f"rank {outcome.rank} got a different {what} from rank 0: "
        f"{show(outcome.result)} != {show(first)}"
        for outcome in outcomes[1:]
        if _value(outcome.result) != _value(first)
    ]


def show(value: object) -> str:
    """A result as a message shows it."""
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


def tensor_problem(
    got: object,
    want: TensorSpec,
    *,
    rank: int,
    shape: tuple[int, ...],
    values: tuple[object, ...],
    device: str,
) -> str | None:
    """How rank ``rank``'s ``got`` differs from a tensor of ``want``'s dtype and these values."""
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


def check(case: Case, outcomes: Sequence[Outcome], devices: Sequence[str]) -> list[str]:
    """How the ranks' outcomes of ``case`` break the contract; empty if they keep it.

    What holds for every kind first (no rank changed its input, every result is the
    caller's own, no rank raised unless errors are the kind's expected results),
    then the kind's own judge (`plait.conformance.ExampleKind.judge`).

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
    kind = EXAMPLE_KINDS.kind_of(case)
    if not kind.raises:
        errors = [
            f"rank {outcome.rank} raised {outcome.error.describe()}\n{outcome.error.traceback}"
            for outcome in outcomes
            if outcome.error is not None
        ]
        if errors:
            return problems + errors
    return problems + kind.judge(case, outcomes, devices)


def failing_parts(
    case: Case, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> tuple[str, ...]:
    """The properties whose failure ``case``'s failure likely follows from (its kind says).

    For a sub-group example, the collectives of it that broke the contract, each
    named by the property that proves it over the whole job: ``reduce_tensors``,
    ``all_gather``, ``broadcast``; empty where the example failed otherwise (a
    member raised, or its results are malformed).
    """
    return EXAMPLE_KINDS.kind_of(case).depends_on(case, outcomes, devices)
