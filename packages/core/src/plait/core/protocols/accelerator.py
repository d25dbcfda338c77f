"""The Accelerator protocol: one kind of device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from plait.core.typing import DeviceSpec

__all__ = ["Accelerator", "SupportsDeviceStats"]


@runtime_checkable
class Accelerator(Protocol):
    """One kind of device (CPU, CUDA, MPS, XLA): finds, parses and prepares devices."""

    @property
    def name(self) -> str:
        """The registry name, e.g. ``"cpu"`` or ``"cuda"``."""
        ...

    def is_available(self) -> bool:
        """Whether this machine has at least one such device."""
        ...

    def auto_device_count(self) -> int:
        """How many devices ``devices="auto"`` means on this machine."""
        ...

    def parse_devices(self, spec: DeviceSpec) -> tuple[int, ...]:
        """Turn a device spec as users write it into device indices.

        For the CPU, ``devices=N`` means N processes: indices ``0..N-1``.

        Raises:
            ConfigurationError: The spec is invalid or asks for devices that do not
                exist; the message says what exists and what to write instead.
        """
        ...

    def get_parallel_devices(self, devices: tuple[int, ...]) -> list[torch.device]:
        """The `torch.device` of each index from `parse_devices`."""
        ...

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` this process's current device (before any tensor is made)."""
        ...

    def teardown(self) -> None:
        """Release what `setup_device` acquired (caches, streams)."""
        ...


@runtime_checkable
class SupportsDeviceStats(Protocol):
    """An accelerator that can report the usage of a device (memory, utilisation)."""

    def get_device_stats(self, device: torch.device) -> dict[str, float]:
        """Current statistics of ``device``, by name, e.g. ``{"memory_allocated_mb": 12.5}``."""
        ...
