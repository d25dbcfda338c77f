"""The grid: explicit examples every run tries first, whatever the profile or seed.

Drawn examples find what nobody thought of, but only by chance: a flaw limited to
three dtypes of twelve, or to world sizes above two, may pass a short run. The grid
closes that gap. For each property and world size it lists examples that cover
every op x dtype, every spelling of every op, Python numbers, scalar, empty and
non-contiguous layouts, every ``src`` (in a sub-group, every member), every late or
absent rank, every kind of mismatch and every documented bad argument, with values
chosen so that the usual slips give a different answer:

- each rank holds different values, negative ones too where the dtype has them,
  so a sum differs from a mean, a max and a product;
- the mean of integers is never a whole number at two ranks or more (a truncating
  mean shows at every world size, not only at two);
- every integer dtype also goes through at its extremes, so a transport through a
  narrower integer or a float (int64 through float64) cannot pass;
- floating values carry digits that the next narrower dtype cannot hold (a float64
  reduced through float32 is off by far more than the tolerance), and reach
  magnitudes a narrower range cannot hold (bfloat16 through float16 overflows);
- every value stays where the exact result is representable, as drawn ones do.

``tests`` of the package check each of these against the slips it exists to show,
per dtype and world size (the audit in the conformance guide).

`prove` runs these before any drawn example, so a run of any profile fails on the
same example every time a flaw shows on the grid.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Final

import attrs

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
    Case,
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
    "point_to_point",
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


def _uneven(column: list[int], low: int, high: int) -> list[int]:
    """``column`` with the last rank's value moved by one where its mean is whole.

    Away from zero, unless that leaves the bounds: a mean over two ranks or more is
    then never a whole number, so a truncating mean shows at every world size.
    """
    size = len(column)
    if size < 2 or sum(column) % size:  # one rank's mean is its own value: whole
        return column
    last = column[-1]
    step = -1 if last < 0 else 1
    moved = last + step if low <= last + step <= high else last - step
    return [*column[:-1], moved]


def _uneven_means(
    pairs: Sequence[tuple[int, int]], low: int, high: int
) -> tuple[tuple[int, int], ...]:
    """``pairs`` (each rank's two elements) with each element's column `_uneven`."""
    firsts = _uneven([pair[0] for pair in pairs], low, high)
    seconds = _uneven([pair[1] for pair in pairs], low, high)
    return tuple(zip(firsts, seconds, strict=True))


@functools.cache
def _int_pairs(dtype: str, op: str | None, world_size: int) -> tuple[tuple[int, int], ...]:
    # Two elements per rank: a positive value that grows with the rank, and a second
    # that differs in sign (or, unsigned, in order) so min, max and sum all differ.
    low, high = int_bounds(dtype, op, world_size)
    pairs = []
    for rank in range(world_size):
        if op is None:  # moved, not reduced: the dtype's extremes, each rank its own
            pairs.append((_clamp(high - rank, low, high), _clamp(low + rank, low, high)))
        elif op == "product":
            first = _clamp(2 + rank % 2, low, high)
            second = _clamp(-1 if rank % 2 else 1, low, high) if low < 0 else 1
            pairs.append((first, second))
        else:  # the second's sign alternates: a column holds both signs
            first = _clamp(rank + 1, low, high)
            signed = (2 * rank + 1) * (1 if rank % 2 else -1)
            second = _clamp(signed, low, high) if low < 0 else _clamp(3 * rank, low, high)
            pairs.append((first, second))
    return _uneven_means(pairs, low, high) if op == "mean" else tuple(pairs)


def _int_values(dtype: str, op: str | None, world_size: int, rank: int) -> tuple[int, int]:
    return _int_pairs(dtype, op, world_size)[rank]


@functools.cache
def _int_extremes(dtype: str, op: str, world_size: int) -> tuple[tuple[int, int], ...]:
    # Values at the edges of what the op keeps in range. The first element is near
    # the largest value on every rank: its sum (or product, or max) needs every bit
    # of the dtype (int64's, more than a float64 holds). The second takes the two
    # edges in turn, so a column mixes signs: a min or max that compares as unsigned
    # shows.
    low, high = int_bounds(dtype, op, world_size)
    if op == "product":
        # Distinct values near the largest root, the signs alternating; and the
        # largest odd root on every rank, whose power has no trailing zero bits to
        # spare: a float with fewer bits than the dtype cannot hold it.
        sign = [(-1) ** rank if low < 0 else 1 for rank in range(world_size)]
        near = [_clamp(high - rank, 1, high) for rank in range(world_size)]
        odd = high if high % 2 else max(1, high - 1)
        return tuple((sign[rank] * near[rank], odd) for rank in range(world_size))
    pairs = [
        (
            _clamp(high - rank, low, high),
            _clamp(low + rank if rank % 2 == 0 else high - rank, low, high),
        )
        for rank in range(world_size)
    ]
    return _uneven_means(pairs, low, high) if op == "mean" else tuple(pairs)


def _float_values(dtype: str, op: str | None, world_size: int, rank: int) -> list[Number]:
    fine = _FINE[dtype]
    if op == "product":
        bound = float_bound(dtype, op, world_size)
        first: float = min(1 + fine * (rank + 1), bound)
        second: float = -min(1 + 2 * fine * (rank + 1), bound) if rank % 2 else 1.0
    elif op is None:  # moved, not reduced: fine digits, and a magnitude near the range's end
        first = (rank + 1) * (1 + fine)
        second = -float_bound(dtype, op, world_size) * (1 - fine * (rank + 1))
    else:
        first = (rank + 1) * (1 + fine)
        second = -(rank + 0.5) * (1 - fine)
    if dtype in COMPLEX_DTYPES:
        return [complex(first, -second), complex(second, first / 2)]
    return [first, second]


def _float_extremes(dtype: str, op: str, world_size: int, rank: int) -> list[Number]:
    # Magnitudes near the largest the op keeps in range, with digits finer than the
    # next narrower dtype holds: a narrower range overflows, a narrower mantissa rounds.
    fine = _FINE[dtype]
    bound = float_bound(dtype, op, world_size)
    first = bound * (1 - fine * (rank + 1))
    second = -bound / 2 * (1 - fine * (2 * rank + 1)) if op != "product" else bound
    if op == "product" and rank % 2:
        first = -first
    if dtype in COMPLEX_DTYPES:
        return [complex(first, -second / 2), complex(second, first / 4)]
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


def _extremes(dtype: str, op: str, world_size: int) -> tuple[TensorSpec, ...]:
    specs = []
    for rank in range(world_size):
        if dtype in INT_DTYPES:
            values: tuple[Number, ...] = _int_extremes(dtype, op, world_size)[rank]
        else:
            values = rounded(dtype, _float_extremes(dtype, op, world_size, rank))
        specs.append(TensorSpec(dtype, (2,), values))
    return tuple(specs)


_SPELLING_DTYPES: Final = ("float64", "int32")
"""The dtypes every other spelling of an op is tried on: a float, and an integer
(whose mean is floating)."""


def reduce_tensors(world_size: int) -> list[Case]:
    """Every op x dtype, and over each shape and layout of `_LAYOUTS`, in each spelling.

    Then every op over each integer and floating dtype at the extremes of its range.
    """
    cases: list[Case] = [
        ReduceCase(op, _per_rank(dtype, op, world_size)) for op in OPS for dtype in dtypes_for(op)
    ]
    for op in OPS:
        for dtype in ("float32", "int64"):
            for shape, layout in _LAYOUTS:
                cases.append(ReduceCase(op, _per_rank(dtype, op, world_size, shape, layout)))
    for op in OPS:
        for spelling in spellings_of(op)[1:]:
            cases += [
                ReduceCase(spelling, _per_rank(dtype, op, world_size)) for dtype in _SPELLING_DTYPES
            ]
    cases += [
        ReduceCase(op, _extremes(dtype, op, world_size))
        for op in OPS
        for dtype in (*INT_DTYPES, *FLOAT_DTYPES, *COMPLEX_DTYPES)
        if dtype in dtypes_for(op)
    ]
    return cases


def reduce_numbers(world_size: int) -> list[Case]:
    """Every spelling of every op over Python ints and floats; ints at int64's extremes."""
    cases: list[Case] = []
    for op in OPS:
        low, high = int_bounds("int64", op, world_size)
        column = [
            int(_int_values("int64", op, world_size, rank)[rank % 2]) for rank in range(world_size)
        ]
        ints: tuple[Value, ...] = tuple(_uneven(column, low, high) if op == "mean" else column)
        floats: tuple[Value, ...] = tuple(
            float(_float_values("float64", op, world_size, rank)[rank % 2])  # type: ignore[arg-type]
            for rank in range(world_size)
        )
        cases += [
            ReduceCase(spelling, numbers)
            for spelling in spellings_of(op)
            for numbers in (ints, floats)
        ]
        extremes = _int_extremes("int64", op, world_size)
        cases.append(ReduceCase(op, tuple(pair[rank % 2] for rank, pair in enumerate(extremes))))
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


def _sent(
    pairs: Sequence[tuple[int, int]], dtype: str, world_size: int, shape: tuple[int, ...] = (2,)
) -> list[Message]:
    # Each sender's values are its own, so a message from another rank shows.
    return [Message(src, dst, _spec(dtype, None, world_size, src, shape)) for src, dst in pairs]


def point_to_point(world_size: int) -> list[Case]:
    """A pipeline's traffic: forward, back, around, every dtype, empty and scalar, all pairs.

    The chain (each place to the next) is every schedule's forward; gradients go back
    along it; a looped schedule's last stage sends to the first. Two messages between
    one pair (of other shapes, then alike but for their values) go in the order they
    were posted; every rank sending to every other shows a message delivered from or
    to the wrong rank.
    """
    if world_size < 2:  # a message goes between two ranks
        return []
    chain = [(place, place + 1) for place in range(world_size - 1)]
    back = [(dst, src) for src, dst in chain]
    cases: list[Case] = [
        PointToPointCase(tuple(_sent(chain, "float32", world_size))),
        PointToPointCase(
            tuple(
                _sent(chain, "float32", world_size, (2, 3))
                + _sent(back, "float64", world_size, (3,))
            )
        ),
        PointToPointCase(tuple(_sent([*chain, (world_size - 1, 0)], "bfloat16", world_size, (4,)))),
    ]
    cases += [PointToPointCase(tuple(_sent(chain, dtype, world_size))) for dtype in DTYPES]
    cases.append(
        PointToPointCase(
            tuple(_sent(chain, "int64", world_size, (0,)) + _sent(chain, "int64", world_size, ()))
        )
    )
    # Twice between each pair, alike but for the values: only the order tells them apart.
    first = _sent(chain, "float32", world_size, (3,))
    second = [
        Message(m.src, m.dst, attrs.evolve(m.tensor, values=tuple(-2 * v for v in m.tensor.values)))
        for m in first
    ]
    cases.append(PointToPointCase((*first, *second)))
    every = [(src, dst) for src in range(world_size) for dst in range(world_size) if src != dst]
    cases.append(PointToPointCase(tuple(_sent(every, "float32", world_size))))
    return cases


_MAX_GROUPS: Final = 31


def _group_inputs(
    members: tuple[int, ...], dtype: str, op: str, world_size: int
) -> tuple[TensorSpec, ...]:
    # The members hold what a job of their size would (an integer mean over them is
    # never whole); the ranks outside hold values of their own, which must not count.
    among = _per_rank(dtype, op, len(members))
    outside = _per_rank(dtype, op, world_size)
    return tuple(
        among[members.index(rank)] if rank in members else outside[rank]
        for rank in range(world_size)
    )


def sub_groups(world_size: int) -> list[Case]:
    """Every group of some ranks, the ops and dtypes in turn.

    ``src`` is the group's last member and, where the group numbers its ranks
    otherwise than the job does, every member in turn. Above five ranks, the groups
    of one, two, all but one and all ranks.
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
            inputs = _group_inputs(members, dtype, op, world_size)
            renumbered = members != tuple(range(size))
            # A src read as a group rank where a global one is meant (or the reverse)
            # shows only where the two differ: there, every member sends once.
            sources = members if renumbered else members[-1:]
            cases += [GroupCase(members, op, src, inputs) for src in sources]
    return cases


def decisions(world_size: int) -> list[Case]:
    """All and any, over unanimous votes and a single dissent at each rank."""
    votes: list[tuple[bool, ...]] = [(True,) * world_size, (False,) * world_size]
    for rank in range(world_size):
        votes.append(tuple(other != rank for other in range(world_size)))
        votes.append(tuple(other == rank for other in range(world_size)))
    return [DecisionCase(vote, every) for every in (True, False) for vote in dict.fromkeys(votes)]


GRID_LATENESS_MS: Final = 50
"""How late the grid's late rank arrives at a barrier.

A barrier that lets ranks out early is seen only where the others read the count
before the late rank adds itself: the drawn lateness (1 to 5 ms) is within what a
loaded machine's scheduling can hide (the store's server answering both ranks'
entries before either's read), so the grid's examples, which every run tries, come
ten times later than the latest drawn one: late enough that a loaded machine's
scheduling does not hide it.
"""


def barrier(world_size: int) -> list[Case]:
    """Each rank in turn arrives late, named and not, with and without a timeout."""
    return [
        BarrierCase(
            "stage" if rank % 2 else None, 60.0 if rank % 2 else None, rank, GRID_LATENESS_MS
        )
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
