"""The MPS accelerator (Apple silicon GPUs)."""

from __future__ import annotations

import torch
from typing_extensions import override

from plait.accelerators.base import DeviceAccelerator

__all__ = ["MPSAccelerator"]


class MPSAccelerator(DeviceAccelerator):
    """The one GPU of an Apple silicon machine."""

    name = "mps"
    device_type = "mps"

    @override
    def is_available(self) -> bool:
        return torch.backends.mps.is_available()

    @override
    def device_count(self) -> int:
        return 1 if self.is_available() else 0

    @override
    def teardown(self) -> None:
        """Return cached memory to the system."""
        if self.is_available():
            torch.mps.empty_cache()
