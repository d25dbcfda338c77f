"""What reductions compute in: dtypes that never truncate, and results of Python numbers."""

from __future__ import annotations

from typing import Final

import torch
import torch.distributed as dist

from plait.core import ReduceOp

__all__ = [
    "DTYPES",
    "TORCH_OPS",
    "combine",
    "number_result",
    "reduce_dtype",
    "reducible",
    "result_dtype",
    "wire",
]

TORCH_OPS: Final = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MEAN: dist.ReduceOp.SUM,  # then divided: gloo has no AVG
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}
"""The torch.distributed operation each reduction runs as."""

DTYPES: Final = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
)  # fmt: skip
"""The dtypes that travel as raw tensors (others are pickled); their index names them."""

_WIRE_DTYPES: Final = {torch.int16: torch.int32}
"""Dtypes that gloo and NCCL cannot move, and the wider dtype each travels as."""


def wire(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` travels as."""
    return _WIRE_DTYPES.get(dtype, dtype)


def reducible(value: object) -> None:
    """Raise unless ``value`` is a tensor or a Python number.

    Raises:
        TypeError: It is neither.
    """
    if not isinstance(value, torch.Tensor | int | float):
        raise TypeError(
            f"reduce takes a tensor or a Python number, got {type(value).__name__}: "
            "convert the value to a tensor first"
        )


def reduce_dtype(
    tensor: torch.Tensor, op: ReduceOp, floating: torch.dtype | None = None
) -> torch.dtype:
    """The dtype ``tensor`` is reduced in.

    The mean of integers or bools is floating (never truncated): ``floating``, or the
    default dtype; other reductions of bools count or compare them as integers.
    """
    if op is ReduceOp.MEAN and not (tensor.is_floating_point() or tensor.is_complex()):
        return floating or torch.get_default_dtype()
    if tensor.dtype == torch.bool:
        return torch.int64
    return wire(tensor.dtype)


def result_dtype(tensor: torch.Tensor, op: ReduceOp, reduced: torch.dtype) -> torch.dtype:
    """The dtype of the result of reducing ``tensor`` in ``reduced``."""
    if tensor.dtype == torch.bool and op in (ReduceOp.MIN, ReduceOp.MAX):
        return torch.bool
    if reduced == wire(tensor.dtype):
        return tensor.dtype
    return reduced


def number_result(value: int | float, op: ReduceOp, reduced: torch.Tensor) -> int | float:
    """The Python number a reduction of the number ``value`` gives."""
    if op is ReduceOp.MEAN or isinstance(value, float):
        return float(reduced.item())
    return int(reduced.item())


def combine(rows: list[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    """Reduce every rank's row, in rank order (the same result on every rank)."""
    result = rows[0]
    for row in rows[1:]:
        if op is ReduceOp.MIN:
            torch.minimum(result, row, out=result)
        elif op is ReduceOp.MAX:
            torch.maximum(result, row, out=result)
        elif op is ReduceOp.PRODUCT:
            result *= row
        else:  # sum, and mean before its division
            result += row
    return result
