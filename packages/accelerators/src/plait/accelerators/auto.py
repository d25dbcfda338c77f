"""Choosing the best accelerator this machine has."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait.accelerators.cpu import CPUAccelerator
from plait.accelerators.cuda import CUDAAccelerator
from plait.accelerators.mps import MPSAccelerator
from plait.accelerators.xla import XLAAccelerator

if TYPE_CHECKING:
    from plait.accelerators.base import DeviceAccelerator

__all__ = ["BUILT_IN", "auto_accelerator", "available_accelerators"]

BUILT_IN: tuple[type[DeviceAccelerator], ...] = (
    XLAAccelerator,
    CUDAAccelerator,
    MPSAccelerator,
    CPUAccelerator,
)
"""The built-in accelerators, best first: what ``"auto"`` tries in order."""


def auto_accelerator() -> DeviceAccelerator:
    """The best accelerator available: XLA, then CUDA, then MPS, then the CPU."""
    for accelerator_class in BUILT_IN:
        accelerator = accelerator_class()
        if accelerator.is_available():
            return accelerator
    return CPUAccelerator()  # always available; reached only if a subclass says otherwise


def available_accelerators() -> list[str]:
    """The names of the built-in accelerators available here, best first."""
    return [cls.name for cls in BUILT_IN if cls().is_available()]
