"""The CPU accelerator: each device is a process."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from plait.accelerators.base import DeviceAccelerator
from plait.accelerators.devices import parse_device_spec

if TYPE_CHECKING:
    from plait.core.typing import DeviceSpec

__all__ = ["CPUAccelerator"]


class CPUAccelerator(DeviceAccelerator):
    """The CPU. ``devices=N`` means N processes, each on the CPU; ``"auto"`` means one."""

    name = "cpu"
    device_type = "cpu"

    @override
    def is_available(self) -> bool:
        return True

    @override
    def device_count(self) -> int:
        return 1

    @override
    def auto_device_count(self) -> int:
        return 1

    @override
    def parse_devices(self, spec: DeviceSpec) -> tuple[int, ...]:
        """Turn ``devices=N`` (or ``"N"``, or ``"auto"``) into N process slots.

        Raises:
            ConfigurationError: The spec is not a positive count: the CPU has no
                device indices to pick, and ``-1`` (every device) has no meaning.
        """
        return parse_device_spec(spec, accelerator=self.name, available=None, auto=1)

    @override
    def get_parallel_devices(self, devices: tuple[int, ...]) -> list[torch.device]:
        """One CPU device per process."""
        return [torch.device("cpu") for _ in devices]

    @override
    def setup_device(self, device: torch.device) -> None:
        """Check that ``device`` is the CPU; there is nothing to make current."""
        super().setup_device(device)
