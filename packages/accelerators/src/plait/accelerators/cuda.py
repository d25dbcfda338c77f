"""The CUDA accelerator (NVIDIA and ROCm GPUs)."""

from __future__ import annotations

import torch
from typing_extensions import override

from plait.accelerators.base import DeviceAccelerator

__all__ = ["CUDAAccelerator"]


class CUDAAccelerator(DeviceAccelerator):
    """CUDA GPUs, one per process; ``"auto"`` means every visible GPU."""

    name = "cuda"
    device_type = "cuda"

    @override
    def is_available(self) -> bool:
        # device_count() asks NVML when it can, without initialising CUDA in this
        # process: torch.cuda.is_available() would, and forked children would then fail.
        return self.device_count() > 0

    @override
    def device_count(self) -> int:
        return torch.cuda.device_count()

    @override
    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` this process's current CUDA device (``cuda`` alone: keep it)."""
        super().setup_device(device)
        if device.index is not None:
            torch.cuda.set_device(device)

    @override
    def teardown(self) -> None:
        """Return cached memory to the driver (nothing, if CUDA was never initialised)."""
        torch.cuda.empty_cache()

    def get_device_stats(self, device: torch.device) -> dict[str, float]:
        """The CUDA caching allocator's statistics for ``device``, by name."""
        return {key: float(value) for key, value in torch.cuda.memory_stats(device).items()}
