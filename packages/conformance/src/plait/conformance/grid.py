"""The grid: explicit examples every run tries first, whatever the profile or seed.

Drawn examples find what nobody thought of, but only by chance: a flaw limited to
three dtypes of twelve, or to world sizes above two, may pass a short run. The grid
closes that gap. For each property and world size it lists examples that cover
every op x dtype, Python numbers, scalar, empty and non-contiguous layouts, every
``src``, every late or absent rank, every kind of mismatch and every documented bad
argument, with values chosen so that the usual slips give a different answer:

- each rank holds different values, negative ones too where the dtype has them,
  so a sum differs from a mean, a max and a product;
- floating values carry digits that the next narrower dtype cannot hold (a float64
  reduced through float32 is off by far more than the tolerance);
- every value stays where the exact result is representable, as drawn ones do.

`prove` runs these before any drawn example, so a run of any profile fails on the
same example every time a flaw shows on the grid.
"""

from __future__ import annotations

import itertools
import math
from typing import Final

from plait.conformance.cases import (
    COMPLEX_DTYPES,
    DTYPES,
    INT_DTYPES,
    OPS,
    AllGatherCase,
    BadArgumentCase,
    BarrierCase,
    BarrierTimeoutCase,
    BroadcastCase,
    Call,
    Case,
    DecisionCase,
    GroupCase,
    MismatchCase,
    Number,
    ReduceCase,
    TensorSpec,
    Value,
)
from plait.conformance.generate import (
    BAD_ARGUMENTS,
    MISMATCH_DTYPES,
    dtypes_for,
    float_bound,
    int_bounds,
    rounded,
)

__all__ = [
    "all_gather",
    "bad_arguments",
    "barrier",
    "barrier_timeout",
    "broadcast",
    "decisions",
    "mismatch",
    "reduce_numbers",
    "reduce_tensors",
    "sub_groups",
]

_FINE: Final = {
    # A step finer than the next narrower dtype holds, coarse enough for this one.
    "float16": 2.0**-9,
    "bfloat16": 2.0**-6,
    "float32": 2.0**-20,
    "float64": 2.0**-40,
    "complex64": 2.0**-20,
    "complex128": 2.0**-40,
}


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _int_values(dtype: str, op: str | None, world_size: int, rank: int) -> tuple[int, int]:
    # Two elements per rank: a positive value that grows with the rank, and a second
    # that differs in sign (or, unsigned, in order) so min, max and sum all differ.
    low, high = int_bounds(dtype, op, world_size)
    if op == "product":
        first = _clamp(2 + rank % 2, low, high)
        second = _clamp(-1 if rank % 2 else 1, low, high) if low < 0 else 1
        return first, second
    first = _clamp(rank + 1, low, high)
    second = _clamp(-(2 * rank + 1), low, high) if low < 0 else _clamp(3 * rank, low, high)
    return first, second


def _float_values(dtype: str, op: str | None, world_size: int, rank: int) -> list[Number]:
    fine = _FINE[dtype]
    if op == "product":
        bound = float_bound(dtype, op, world_size)
        first: float = min(1 + fine * (rank + 1), bound)
        second: float = -min(1 + 2 * fine * (rank + 1), bound) if rank % 2 else 1.0
    else:
        first = (rank + 1) * (1 + fine)
        second = -(rank + 0.5) * (1 - fine)
    if dtype in COMPLEX_DTYPES:
        return [complex(first, -second), complex(second, first / 2)]
    return [first, second]


def _values(dtype: str, op: str | None, world_size: int, rank: int) -> tuple[Number, ...]:
    if dtype == "bool":
        return (True, rank % 2 == 0)
    if dtype in INT_DTYPES:
        return _int_values(dtype, op, world_size, rank)
    return rounded(dtype, _float_values(dtype, op, world_size, rank))


def _spec(  # noqa: PLR0917 - a tensor's description, as _per_rank passes it on
    dtype: str,
    op: str | None,
    world_size: int,
    rank: int,
    shape: tuple[int, ...] = (2,),
    layout: str = "contiguous",
) -> TensorSpec:
    pair = _values(dtype, op, world_size, rank)
    values = tuple(itertools.islice(itertools.cycle(pair), math.prod(shape)))
    return TensorSpec(dtype, shape, values, layout)  # type: ignore[arg-type]


def _per_rank(
    dtype: str,
    op: str | None,
    world_size: int,
    shape: tuple[int, ...] = (2,),
    layout: str = "contiguous",
) -> tuple[TensorSpec, ...]:
    return tuple(_spec(dtype, op, world_size, rank, shape, layout) for rank in range(world_size))


_LAYOUTS: Final = (
    ((), "contiguous"),
    ((0,), "contiguous"),
    ((2, 0), "transposed"),
    ((2, 3), "transposed"),
    ((3,), "strided"),
)
"""Shapes and layouts every reduce and gather covers: scalar, empty, non-contiguous."""


def reduce_tensors(world_size: int) -> list[Case]:
    """Every op x dtype, then every op over each shape and layout of `_LAYOUTS`."""
    cases: list[Case] = [
        ReduceCase(op, _per_rank(dtype, op, world_size)) for op in OPS for dtype in dtypes_for(op)
    ]
    for op in OPS:
        for dtype in ("float32", "int64"):
            for shape, layout in _LAYOUTS:
                cases.append(ReduceCase(op, _per_rank(dtype, op, world_size, shape, layout)))
    return cases


def reduce_numbers(world_size: int) -> list[Case]:
    """Every op over Python ints and over Python floats."""
    cases: list[Case] = []
    for op in OPS:
        ints: tuple[Value, ...] = tuple(
            int(_int_values("int64", op, world_size, rank)[rank % 2]) for rank in range(world_size)
        )
        floats: tuple[Value, ...] = tuple(
            float(_float_values("float64", op, world_size, rank)[rank % 2])  # type: ignore[arg-type]
            for rank in range(world_size)
        )
        cases += [ReduceCase(op, ints), ReduceCase(op, floats)]
    return cases


def broadcast(world_size: int) -> list[Case]:
    """From every ``src``: a non-contiguous tensor, an empty one and an object; every dtype."""
    cases: list[Case] = []
    for src in range(world_size):
        tensors = _per_rank("float64", None, world_size, (2, 3), "transposed")
        empty = _per_rank("int64", None, world_size, (0,))
        objects = tuple({"rank": rank, "items": [rank, str(rank)]} for rank in range(world_size))
        cases += [
            BroadcastCase(src, tensors),
            BroadcastCase(src, empty),
            BroadcastCase(src, objects),
        ]
    last = world_size - 1
    cases += [BroadcastCase(last, _per_rank(dtype, None, world_size)) for dtype in DTYPES]
    cases.append(BroadcastCase(last, _per_rank("float32", None, world_size, (3,), "strided")))
    cases.append(BroadcastCase(last, _per_rank("int64", None, world_size, ())))
    return cases


def all_gather(world_size: int) -> list[Case]:
    """Every dtype, and each shape and layout of `_LAYOUTS`."""
    cases: list[Case] = [AllGatherCase(_per_rank(dtype, None, world_size)) for dtype in DTYPES]
    cases += [
        AllGatherCase(_per_rank("float32", None, world_size, shape, layout))
        for shape, layout in _LAYOUTS
    ]
    return cases


_MAX_GROUPS: Final = 31


def sub_groups(world_size: int) -> list[Case]:
    """Every group of some ranks, ``src`` its last member, the ops and dtypes in turn.

    Above five ranks, the groups of one, two, all but one and all ranks.
    """
    cases: list[Case] = []
    ops = itertools.cycle(OPS)
    dtypes = itertools.cycle(("float64", "int64", "float32", "int32"))
    sizes = list(range(1, world_size + 1))
    if 2**world_size - 1 > _MAX_GROUPS:  # the smallest and the largest groups only
        sizes = sorted({1, 2, world_size - 1, world_size})
    for size in sizes:
        for members in itertools.combinations(range(world_size), size):
            op, dtype = next(ops), next(dtypes)
            inputs = _per_rank(dtype, op, world_size)
            cases.append(GroupCase(members, op, members[-1], inputs))
    return cases


def decisions(world_size: int) -> list[Case]:
    """All and any, over unanimous votes and a single dissent at each rank."""
    votes: list[tuple[bool, ...]] = [(True,) * world_size, (False,) * world_size]
    for rank in range(world_size):
        votes.append(tuple(other != rank for other in range(world_size)))
        votes.append(tuple(other == rank for other in range(world_size)))
    return [DecisionCase(vote, every) for every in (True, False) for vote in dict.fromkeys(votes)]


def barrier(world_size: int) -> list[Case]:
    """Each rank in turn arrives late, named and not, with and without a timeout."""
    return [
        BarrierCase("stage" if rank % 2 else None, 60.0 if rank % 2 else None, rank, 5)
        for rank in range(world_size)
    ]


def barrier_timeout(world_size: int) -> list[Case]:
    """The first rank absent, and the last: each example restarts the ranks."""
    absent = sorted({0, world_size - 1})
    return [BarrierTimeoutCase(rank, 0.2) for rank in absent]


def _zeros(dtype: str, shape: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(dtype, shape, (False if dtype == "bool" else 0,) * math.prod(shape))


def _pairs(world_size: int) -> list[tuple[Call, Call]]:
    # A call and a variant of it that must not be mixed with it: every kind of change.
    base_tensor = _zeros(MISMATCH_DTYPES[0], (2,))
    other_shape = _zeros(MISMATCH_DTYPES[0], (3,))
    other_dtype = _zeros(MISMATCH_DTYPES[1], (2,))
    reduce_sum = Call("reduce", base_tensor, "sum")
    gather = Call("all_gather", base_tensor)
    send = Call("broadcast", base_tensor, 0)
    wait = Call("barrier")
    decide = Call("reduce_boolean_decision", None, arg=True)
    return [
        (reduce_sum, gather),
        (reduce_sum, Call("reduce", other_shape, "sum")),
        (reduce_sum, Call("reduce", other_dtype, "sum")),
        (reduce_sum, Call("reduce", base_tensor, "max")),
        (gather, send),
        (gather, Call("all_gather", other_shape)),
        (gather, Call("all_gather", other_dtype)),
        (send, wait),
        (send, Call("broadcast", base_tensor, world_size - 1)),
        (wait, decide),
        (decide, reduce_sum),
        (decide, Call("reduce_boolean_decision", None, arg=False)),
    ]


def mismatch(world_size: int) -> list[Case]:
    """Every kind of mismatch, the variant made by one rank, a different one each time."""
    cases: list[Case] = []
    for index, (base, variant) in enumerate(_pairs(world_size)):
        odd = index % world_size
        calls = tuple(variant if rank == odd else base for rank in range(world_size))
        cases.append(MismatchCase(calls))
    return cases


def bad_arguments(world_size: int) -> list[Case]:
    """Every documented bad argument, every rank passing it alike."""
    return [
        BadArgumentCase(collective, argument, value, expected)
        for collective, argument, values, expected in BAD_ARGUMENTS(world_size)
        for value in values
    ]
