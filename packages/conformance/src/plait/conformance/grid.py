"""The grid's values: what the explicit examples every run tries first are made of.

Each kind lists its own grid (`plait.conformance.kinds`) from these values.

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

from plait.conformance.cases import (
    COMPLEX_DTYPES,
    INT_DTYPES,
    Number,
    TensorSpec,
)
from plait.conformance.generate import float_bound, int_bounds, rounded

__all__ = [
    "SHAPES_AND_LAYOUTS",
    "extremes",
    "float_values",
    "int_extremes",
    "int_values",
    "per_rank",
    "rank_spec",
    "uneven",
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


def uneven(column: list[int], low: int, high: int) -> list[int]:
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
    """``pairs`` (each rank's two elements) with each element's column `uneven`."""
    firsts = uneven([pair[0] for pair in pairs], low, high)
    seconds = uneven([pair[1] for pair in pairs], low, high)
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


def int_values(dtype: str, op: str | None, world_size: int, rank: int) -> tuple[int, int]:
    """``rank``'s two integers: growing with the rank, of both signs, a mean never whole."""
    return _int_pairs(dtype, op, world_size)[rank]


@functools.cache
def int_extremes(dtype: str, op: str, world_size: int) -> tuple[tuple[int, int], ...]:
    """Each rank's two integers at the edges of what ``op`` keeps in ``dtype``'s range."""
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


def float_values(dtype: str, op: str | None, world_size: int, rank: int) -> list[Number]:
    """``rank``'s two floats, with digits the next narrower dtype cannot hold."""
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
        return int_values(dtype, op, world_size, rank)
    return rounded(dtype, float_values(dtype, op, world_size, rank))


def rank_spec(  # noqa: PLR0917 - a tensor's description, as per_rank passes it on
    dtype: str,
    op: str | None,
    world_size: int,
    rank: int,
    shape: tuple[int, ...] = (2,),
    layout: str = "contiguous",
) -> TensorSpec:
    """``rank``'s tensor of ``shape``: its values (`int_values`, `float_values`) in turn."""
    pair = _values(dtype, op, world_size, rank)
    values = tuple(itertools.islice(itertools.cycle(pair), math.prod(shape)))
    return TensorSpec(dtype, shape, values, layout)  # type: ignore[arg-type]


def per_rank(
    dtype: str,
    op: str | None,
    world_size: int,
    shape: tuple[int, ...] = (2,),
    layout: str = "contiguous",
) -> tuple[TensorSpec, ...]:
    """Every rank's tensor (`rank_spec`), each holding values of its own."""
    return tuple(
        rank_spec(dtype, op, world_size, rank, shape, layout) for rank in range(world_size)
    )


SHAPES_AND_LAYOUTS: Final = (
    ((), "contiguous"),
    ((0,), "contiguous"),
    ((2, 0), "transposed"),
    ((2, 3), "transposed"),
    ((3,), "strided"),
)
"""Shapes and layouts every reduce and gather covers: scalar, empty, non-contiguous."""


def extremes(dtype: str, op: str, world_size: int) -> tuple[TensorSpec, ...]:
    """Every rank's tensor at the edges of the range ``op`` keeps in ``dtype``."""
    specs = []
    for rank in range(world_size):
        if dtype in INT_DTYPES:
            values: tuple[Number, ...] = int_extremes(dtype, op, world_size)[rank]
        else:
            values = rounded(dtype, _float_extremes(dtype, op, world_size, rank))
        specs.append(TensorSpec(dtype, (2,), values))
    return tuple(specs)
