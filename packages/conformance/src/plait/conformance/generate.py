"""What the kinds' Hypothesis strategies draw from: shapes, bounded values, tensors, objects.

Each kind of example draws its own cases (`plait.conformance.kinds`) from these.

Values are drawn where the exact result is representable in the dtype: sums of
integers do not overflow, products stay in range, floats are rounded to the dtype
before they are used, so the reference in `plait.conformance.spec` is exact and
only the order of a floating sum is left to the strategy.
"""

from __future__ import annotations

import functools
import math
from typing import Final

import torch
from hypothesis import strategies as st

from plait.conformance.cases import (
    COMPLEX_DTYPES,
    DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    Number,
    TensorSpec,
)

__all__ = [
    "any_tensor",
    "dtypes_for",
    "float_bound",
    "floats",
    "int_bounds",
    "objects",
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


def floats(dtype: str, op: str | None, world_size: int, width: int) -> st.SearchStrategy[float]:
    """Floats of ``width`` bits whose ``op`` over the ranks stays in ``dtype``'s range."""
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
    real = floats(dtype, op, world_size, width)
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
def any_tensor(draw: st.DrawFn) -> TensorSpec:
    """A tensor of any dtype, shape and layout."""
    dtype = draw(st.sampled_from(DTYPES))
    return draw(tensor_specs(dtype, draw(shapes())))
