"""Hypothesis strategies that draw the examples: every rank's input to a collective.

Values are drawn where the exact result is representable in the dtype: sums of
integers do not overflow, products stay in range, floats are rounded to the dtype
before they are used, so the reference in `plait.conformance.spec` is exact and
only the order of a floating sum is left to the strategy.
"""

from __future__ import annotations

import functools
import math
from typing import Final

import attrs
import torch
from hypothesis import strategies as st

from plait.conformance.cases import (
    COMPLEX_DTYPES,
    DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    OPS,
    AllGatherCase,
    BadArgumentCase,
    BarrierCase,
    BarrierTimeoutCase,
    BroadcastCase,
    Call,
    DecisionCase,
    GroupCase,
    Message,
    MismatchCase,
    Number,
    PointToPointCase,
    ReduceCase,
    TensorSpec,
    Value,
    spellings_of,
)

__all__ = [
    "BAD_ARGUMENTS",
    "MISMATCH_DTYPES",
    "all_gather_cases",
    "bad_argument_cases",
    "barrier_cases",
    "barrier_timeout_cases",
    "broadcast_cases",
    "decision_cases",
    "dtypes_for",
    "float_bound",
    "group_cases",
    "int_bounds",
    "mismatch_cases",
    "objects",
    "point_to_point_cases",
    "reduce_cases",
    "rounded",
    "shapes",
    "tensor_specs",
]

_INT_RANGES: Final = {
    name: (torch.iinfo(getattr(torch, name)).min, torch.iinfo(getattr(torch, name)).max)
    for name in INT_DTYPES
}
_MAX_EXPONENT: Final = {"float16": 15, "bfloat16": 127, "float32": 127, "float64": 1023}
_SUM_BOUND: Final = {
    "float16": 2.0**10,
    "bfloat16": 2.0**20,
    "float32": 2.0**20,
    "float64": 2.0**40,
}
_WIDTH: Final = {"float16": 16, "bfloat16": 32, "float32": 32, "float64": 64}
MISMATCH_DTYPES: Final = ("float32", "float64", "int32", "int64")


@functools.cache
def shapes(*, max_dims: int = 3, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes of up to ``max_dims`` dimensions, zero-size ones included."""
    return st.lists(st.integers(0, max_side), max_size=max_dims).map(tuple)


def int_bounds(dtype: str, op: str | None, world_size: int) -> tuple[int, int]:
    """The values of integer ``dtype`` whose ``op`` over ``world_size`` ranks cannot overflow."""
    low, high = _INT_RANGES[dtype]
    if op in ("sum", "mean"):
        return -(-low // world_size), high // world_size
    if op == "product":
        root = int(high ** (1 / world_size))
        while (root + 1) ** world_size <= high:
            root += 1
        while root**world_size > high:
            root -= 1
        return max(low, -root), root
    return low, high


def float_bound(dtype: str, op: str | None, world_size: int) -> float:
    """The largest magnitude of ``dtype`` that keeps ``op`` over ``world_size`` ranks in range."""
    base = dtype if dtype in FLOAT_DTYPES else ("float32" if dtype == "complex64" else "float64")
    bound = _SUM_BOUND[base]
    if op == "product":
        # A power of two, which every float width represents exactly.
        bound = min(bound, 2.0 ** (_MAX_EXPONENT[base] // world_size - 1))
    return bound


def _floats(dtype: str, op: str | None, world_size: int, width: int) -> st.SearchStrategy[float]:
    bound = float_bound(dtype, op, world_size)
    floats = st.floats(-bound, bound, allow_nan=False, allow_infinity=False, width=width)  # type: ignore[arg-type]
    if op != "product":
        return floats
    # Magnitudes of at least 1 / bound keep every partial product, in any order,
    # a normal number: a product that passes through the subnormals loses digits that
    # depend on the order the ranks multiply in, which no tolerance can state.
    smallest = 1 / bound
    return floats.map(lambda value: value if abs(value) >= smallest else 0.0)


def rounded(dtype: str, values: list[Number]) -> tuple[Number, ...]:
    """``values`` as a tensor of ``dtype`` holds them: what the reference must see."""
    return tuple(torch.tensor(values, dtype=getattr(torch, dtype)).tolist())


@functools.cache
def _elements(dtype: str, op: str | None, world_size: int) -> st.SearchStrategy[Number]:
    if dtype == "bool":
        return st.booleans()
    if dtype in INT_DTYPES:
        low, high = int_bounds(dtype, op, world_size)
        return st.integers(low, high)
    width = 64 if dtype == "complex128" else _WIDTH.get(dtype, 32)
    real = _floats(dtype, op, world_size, width)
    if dtype in COMPLEX_DTYPES:
        return st.builds(complex, real, real)
    return real


@functools.cache
def _element_lists(
    dtype: str, op: str | None, world_size: int, size: int
) -> st.SearchStrategy[list[Number]]:
    return st.lists(_elements(dtype, op, world_size), min_size=size, max_size=size)


@functools.cache
def _layouts(shape: tuple[int, ...]) -> st.SearchStrategy[str]:
    if len(shape) >= 2:
        return st.sampled_from(("contiguous", "transposed", "strided"))
    if shape:
        return st.sampled_from(("contiguous", "strided"))
    return st.just("contiguous")


@st.composite
def tensor_specs(
    draw: st.DrawFn,
    dtype: str,
    shape: tuple[int, ...],
    *,
    op: str | None = None,
    world_size: int = 1,
) -> TensorSpec:
    """A tensor of ``dtype`` and ``shape`` in any layout, its values safe for ``op``."""
    values = draw(_element_lists(dtype, op, world_size, math.prod(shape)))
    held = tuple(values) if dtype in ("bool", *INT_DTYPES) else rounded(dtype, values)
    return TensorSpec(dtype, shape, held, draw(_layouts(shape)))  # type: ignore[arg-type]


def dtypes_for(op: str) -> tuple[str, ...]:
    """The dtypes ``op`` is defined on: complex numbers have no order, nor a product."""
    return DTYPES if op in ("sum", "mean") else tuple(d for d in DTYPES if d not in COMPLEX_DTYPES)


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
            number = _floats("float64", op, world_size, 64)
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


@functools.cache
def objects() -> st.SearchStrategy[object]:
    """Picklable Python objects: nested lists, tuples and dicts of plain values."""
    leaves = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=8)
        | st.binary(max_size=8)
    )
    return st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=3)
            | st.tuples(children, children)
            | st.dictionaries(st.text(max_size=4), children, max_size=3)
        ),
        max_leaves=8,
    )


@st.composite
def _any_tensor(draw: st.DrawFn) -> TensorSpec:
    dtype = draw(st.sampled_from(DTYPES))
    return draw(tensor_specs(dtype, draw(shapes())))


@st.composite
def broadcast_cases(draw: st.DrawFn, world_size: int) -> BroadcastCase:
    """Each rank holds its own tensor or object; any rank is ``src``."""
    src = draw(st.integers(0, world_size - 1), label="src")
    return BroadcastCase(src, tuple(draw(_broadcast_values()) for _ in range(world_size)))


@functools.cache
def _broadcast_values() -> st.SearchStrategy[object]:
    return _any_tensor() | objects()


@st.composite
def point_to_point_cases(draw: st.DrawFn, world_size: int) -> PointToPointCase:
    """A pipeline's traffic, posted in any order, each message of any dtype and shape.

    Each place sends to the next (activations, stage to stage), so every rank sends
    or receives; then up to four more messages between any two places (gradients
    back, the last stage's to the first in a looped schedule, several between one
    pair).
    """
    places = st.integers(0, world_size - 1)
    chain = [(place, place + 1) for place in range(world_size - 1)]
    more = draw(
        st.lists(st.tuples(places, places).filter(lambda pair: pair[0] != pair[1]), max_size=4),
        label="more",
    )
    pairs = draw(st.permutations([*chain, *more]), label="order")
    return PointToPointCase(
        tuple(Message(src, dst, draw(_contiguous_tensor())) for src, dst in pairs)
    )


@st.composite
def _contiguous_tensor(draw: st.DrawFn) -> TensorSpec:
    return attrs.evolve(draw(_any_tensor()), layout="contiguous")


@st.composite
def group_cases(draw: st.DrawFn, world_size: int) -> GroupCase:
    """Some ranks (at least one) collect over a group of just them; the others stay out."""
    members = tuple(
        sorted(
            draw(
                st.sets(st.integers(0, world_size - 1), min_size=1, max_size=world_size),
                label="members",
            )
        )
    )
    op = draw(st.sampled_from(OPS), label="op")
    spelling = draw(st.sampled_from(spellings_of(op)), label="spelling")
    src = draw(st.sampled_from(members), label="src")
    dtype = draw(st.sampled_from(dtypes_for(op)), label="dtype")
    specs = tensor_specs(dtype, draw(shapes(), label="shape"), op=op, world_size=world_size)
    return GroupCase(members, spelling, src, tuple(draw(specs) for _ in range(world_size)))


@st.composite
def all_gather_cases(draw: st.DrawFn, world_size: int) -> AllGatherCase:
    """Every rank gathers a tensor of one dtype and shape, in any layout."""
    dtype = draw(st.sampled_from(DTYPES), label="dtype")
    specs = tensor_specs(dtype, draw(shapes(), label="shape"))
    return AllGatherCase(tuple(draw(specs) for _ in range(world_size)))


@functools.cache
def decision_cases(world_size: int) -> st.SearchStrategy[DecisionCase]:
    """Each rank votes; the ranks ask for all or any."""
    votes = st.lists(st.booleans(), min_size=world_size, max_size=world_size).map(tuple)
    return st.builds(DecisionCase, votes, st.booleans())


@functools.cache
def barrier_cases(world_size: int) -> st.SearchStrategy[BarrierCase]:
    """A barrier, named or not, with or without a timeout, one rank arriving late."""
    return st.builds(
        BarrierCase,
        name=st.none() | st.text("abcdefghijklmnopqrstuvwxyz-_0123456789", max_size=12),
        timeout=st.none() | st.floats(30, 120),
        late_rank=st.integers(0, world_size - 1),
        delay_ms=st.integers(1, 5),
    )


@functools.cache
def barrier_timeout_cases(world_size: int) -> st.SearchStrategy[BarrierTimeoutCase]:
    """One rank stays away from a barrier the others enter with a short timeout."""
    return st.builds(
        BarrierTimeoutCase,
        absent_rank=st.integers(0, world_size - 1),
        timeout=st.floats(0.05, 0.5),
    )


def _zeros(dtype: str, shape: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(dtype, shape, (False if dtype == "bool" else 0,) * math.prod(shape))


_COLLECTIVES: Final = ("reduce", "all_gather", "broadcast", "barrier", "reduce_boolean_decision")


def _call(draw: st.DrawFn, collective: str, world_size: int) -> Call:
    tensor = None
    if collective in ("reduce", "all_gather", "broadcast"):
        tensor = _zeros(draw(st.sampled_from(MISMATCH_DTYPES)), draw(shapes(max_dims=2)))
    arg: object = None
    if collective == "reduce":
        arg = draw(st.sampled_from(OPS))
    elif collective == "broadcast":
        arg = draw(st.integers(0, world_size - 1))
    elif collective == "reduce_boolean_decision":
        arg = draw(st.booleans())
    return Call(collective, tensor, arg)


@st.composite
def _calls(draw: st.DrawFn, world_size: int) -> tuple[Call, Call]:
    """A call, and a variant of it that the contract says must not be mixed with it."""
    collective = draw(st.sampled_from(_COLLECTIVES))
    base = _call(draw, collective, world_size)
    changes = ["collective"]
    if collective in ("reduce", "all_gather"):
        changes += ["shape", "dtype"]
    if collective in ("reduce", "broadcast", "reduce_boolean_decision"):
        changes.append("arg")
    change = draw(st.sampled_from(changes))
    tensor = base.tensor
    if change == "shape":
        assert tensor is not None
        other_shape = draw(shapes(max_dims=2).filter(lambda shape: shape != tensor.shape))
        return base, Call(collective, _zeros(tensor.dtype, other_shape), base.arg)
    if change == "dtype":
        assert tensor is not None
        other = draw(st.sampled_from([d for d in MISMATCH_DTYPES if d != tensor.dtype]))
        return base, Call(collective, _zeros(other, tensor.shape), base.arg)
    if change == "arg":
        if collective == "reduce":
            other_arg: object = draw(st.sampled_from([op for op in OPS if op != base.arg]))
        elif collective == "broadcast":
            other_arg = draw(st.sampled_from([src for src in range(world_size) if src != base.arg]))
        else:
            other_arg = not base.arg
        return base, Call(collective, tensor, other_arg)
    other_collective = draw(st.sampled_from([c for c in _COLLECTIVES if c != collective]))
    return base, _call(draw, other_collective, world_size)


@st.composite
def mismatch_cases(draw: st.DrawFn, world_size: int) -> MismatchCase:
    """Some ranks (not all, not none) make a call that differs from the others'."""
    if world_size < 2:
        raise ValueError("a mismatch needs two ranks or more")
    base, variant = draw(_calls(world_size), label="calls")
    others = draw(
        st.sets(st.integers(0, world_size - 1), min_size=1, max_size=world_size - 1),
        label="ranks with the variant",
    )
    return MismatchCase(tuple(variant if rank in others else base for rank in range(world_size)))


def BAD_ARGUMENTS(  # noqa: N802 - a table, computed for a world size
    world_size: int,
) -> tuple[tuple[str, str, tuple[object, ...], str], ...]:
    """Each documented bad argument: collective, argument, bad values, the error it raises."""
    not_numbers: tuple[object, ...] = ("1", b"1", None, [1.0], {"value": 1}, (2,))
    return (
        ("reduce", "value", not_numbers, "TypeError"),
        (
            "reduce",
            "reduce_op",
            ("median", "mode", "add", "averag", "bitwise_and", "xor"),
            "ConfigurationError",
        ),
        ("broadcast", "src", (-1, world_size, world_size + 1, 2**31), "ValueError"),
        ("all_gather", "tensor", not_numbers, "TypeError"),
        ("barrier", "timeout", (0, -1, 0.0, -0.5), "ValueError"),
    )


@functools.cache
def bad_argument_cases(world_size: int) -> st.SearchStrategy[BadArgumentCase]:
    """A bad argument every rank passes alike, and the error the contract documents."""
    return st.one_of(
        *(
            st.builds(
                BadArgumentCase,
                st.just(collective),
                st.just(argument),
                st.sampled_from(values),
                st.just(expected),
            )
            for collective, argument, values, expected in BAD_ARGUMENTS(world_size)
        )
    )
