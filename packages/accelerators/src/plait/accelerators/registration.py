"""Registers the built-in accelerators (entry point ``plait.accelerators``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait.accelerators.auto import auto_accelerator
from plait.accelerators.cpu import CPUAccelerator
from plait.accelerators.cuda import CUDAAccelerator
from plait.accelerators.mps import MPSAccelerator
from plait.accelerators.xla import XLAAccelerator

if TYPE_CHECKING:
    from plait.core import Accelerator, Registry

__all__ = ["register"]


def register(registry: Registry[Accelerator]) -> None:
    """Register ``cpu``, ``cuda`` (alias ``gpu``), ``mps``, ``xla`` (alias ``tpu``) and ``auto``."""
    registry.register("cpu", CPUAccelerator, description="the CPU; devices=N runs N processes")
    registry.register("cuda", CUDAAccelerator, description="CUDA GPUs")
    registry.register("gpu", CUDAAccelerator, description="CUDA GPUs (alias of cuda)")
    registry.register("mps", MPSAccelerator, description="the Apple silicon GPU")
    registry.register("xla", XLAAccelerator, description="XLA devices through torch_xla")
    registry.register("tpu", XLAAccelerator, description="TPU cores (alias of xla)")
    registry.register(
        "auto",
        auto_accelerator,
        description="the best available: a plugin's, then xla, cuda, mps, then cpu",
    )
