"""How a broadcast's value travels: described in the meeting, inline when small.

The source posts ``KIND:BODY`` in the meeting that checks the call: a small tensor
or pickle travels in it whole, a larger one is described (dtype and shape, or the
pickle's length) and follows in one broadcast.
"""

from __future__ import annotations

import ctypes
import pickle
from typing import Final

import torch

from plait.strategies.collectives.reduction import DTYPES

__all__ = [
    "INLINE_ALL_BYTES",
    "INLINE_BYTES",
    "INLINE_OBJECT",
    "INLINE_TENSOR",
    "MAX_FAST_DIMS",
    "PICKLED",
    "TENSOR",
    "UNPICKLABLE",
    "describe",
    "fast",
    "own_copy",
    "tensor_bytes",
    "tensor_from_bytes",
]

INLINE_TENSOR: Final = b"t"
"""dtype index:shape:the tensor's bytes."""
TENSOR: Final = b"T"
"""dtype index:shape; the data follows in a broadcast."""
INLINE_OBJECT: Final = b"o"
"""The pickled object."""
PICKLED: Final = b"O"
"""The pickle's length; the pickle follows in a broadcast."""
UNPICKLABLE: Final = b"E"
"""Why the object cannot be pickled."""

INLINE_BYTES: Final = 8 * 1024
"""Values up to this size travel in the meeting itself: no broadcast at all."""
INLINE_ALL_BYTES: Final = 32 * 1024
"""A reduce or all_gather whose tensors take up to this much over all ranks travels in
the meeting, where every rank reads every rank's tensor: no collective at all."""
MAX_FAST_DIMS: Final = 16
"""Tensors of up to this many dimensions travel raw; others are pickled."""


def fast(obj: object) -> bool:
    """Whether ``obj`` travels as a raw tensor."""
    return isinstance(obj, torch.Tensor) and obj.dtype in DTYPES and obj.dim() <= MAX_FAST_DIMS


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes of ``tensor``'s elements, in order."""
    flat = tensor.detach().to("cpu").contiguous()
    size = flat.numel() * flat.element_size()
    return ctypes.string_at(flat.data_ptr(), size) if size else b""


def tensor_from_bytes(data: bytes, dtype: torch.dtype, dims: list[int]) -> torch.Tensor:
    """The tensor whose bytes `tensor_bytes` gave."""
    if not data:
        return torch.empty(dims, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(dims)


def own_copy(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A contiguous copy of ``tensor`` on ``device``, sharing nothing with it."""
    return tensor.detach().to(device, memory_format=torch.contiguous_format, copy=True)


def describe(obj: object, *, inline: bool) -> tuple[bytes, bytes]:
    """What the source posts about ``obj``, and its pickle if it made one."""
    if fast(obj):
        assert isinstance(obj, torch.Tensor)
        head = f"{DTYPES.index(obj.dtype)}:{','.join(map(str, obj.shape))}".encode()
        if inline and obj.numel() * obj.element_size() <= INLINE_BYTES:
            return INLINE_TENSOR + b":" + head + b":" + tensor_bytes(obj), b""
        return TENSOR + b":" + head, b""
    try:
        pickled = pickle.dumps(obj)
    except Exception as error:  # noqa: BLE001 - any failure is reported to every rank
        return UNPICKLABLE + b":" + f"{type(error).__name__}: {error}".encode(), b""
    if inline and len(pickled) <= INLINE_BYTES:
        return INLINE_OBJECT + b":" + pickled, pickled
    return PICKLED + b":" + str(len(pickled)).encode(), pickled
