"""Accelerators: the kinds of device a strategy runs on.

CPU, CUDA, MPS and XLA devices, each meeting the `plait.core.Accelerator` protocol,
registered in `plait.core.AcceleratorRegistry` as ``cpu``, ``cuda`` (alias ``gpu``),
``mps``, ``xla`` (alias ``tpu``) and ``auto`` (the best available).
`TPUAccelerator`, the XLA accelerator's older name in Lightning, is `XLAAccelerator`.
"""

from plait.accelerators.auto import auto_accelerator, available_accelerators
from plait.accelerators.base import DeviceAccelerator
from plait.accelerators.cpu import CPUAccelerator
from plait.accelerators.cuda import CUDAAccelerator
from plait.accelerators.devices import parse_device_spec
from plait.accelerators.mps import MPSAccelerator
from plait.accelerators.xla import XLAAccelerator

TPUAccelerator = XLAAccelerator
"""Lightning's older name of `XLAAccelerator`: the same class."""

__all__ = [
    "CPUAccelerator",
    "CUDAAccelerator",
    "DeviceAccelerator",
    "MPSAccelerator",
    "TPUAccelerator",
    "XLAAccelerator",
    "auto_accelerator",
    "available_accelerators",
    "parse_device_spec",
]
