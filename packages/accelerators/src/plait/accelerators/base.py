"""What the accelerators share: parsing specs against the devices that exist."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

import torch

from plait.accelerators.auto import available_accelerators
from plait.accelerators.devices import parse_device_spec
from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.core.typing import DeviceSpec

__all__ = ["DeviceAccelerator"]


class DeviceAccelerator(abc.ABC):
    """An accelerator whose devices are numbered: ``torch.device(device_type, index)``.

    Subclasses name the device type and say how many devices exist; parsing,
    validation and device objects follow from that.
    """

    name: ClassVar[str]
    device_type: ClassVar[str]

    @abc.abstractmethod
    def is_available(self) -> bool:
        """Whether this machine has at least one such device."""

    @abc.abstractmethod
    def device_count(self) -> int:
        """How many such devices this process can use."""

    def auto_device_count(self) -> int:
        """Every device: what ``devices="auto"`` means."""
        return self.device_count()

    def parse_devices(self, spec: DeviceSpec) -> tuple[int, ...]:
        """Turn a device spec into device indices, checked against the devices that exist.

        Raises:
            ConfigurationError: The accelerator is not available, or the spec is
                invalid (see `parse_device_spec`).
        """
        self.require_available()
        return parse_device_spec(
            spec,
            accelerator=self.name,
            available=self.device_count(),
            auto=self.auto_device_count(),
        )

    def get_parallel_devices(self, devices: tuple[int, ...]) -> list[torch.device]:
        """The device of each index."""
        return [torch.device(self.device_type, index) for index in devices]

    def setup_device(self, device: torch.device) -> None:
        """Check that ``device`` is of this accelerator's type; subclasses make it current."""
        if device.type != self.device_type:
            raise ConfigurationError(
                f"the {self.name} accelerator cannot set up the device {device}",
                value=device,
                fix=f"pass a {self.device_type} device, e.g. torch.device({self.device_type!r}, 0)",
            )

    def teardown(self) -> None:  # noqa: B027 (a default that subclasses may extend)
        """Nothing to release by default."""

    def require_available(self) -> None:
        """Raise unless this machine has such a device.

        Raises:
            ConfigurationError: It has none; names the accelerators that are available.
        """
        if self.is_available():
            return
        available = available_accelerators()
        raise ConfigurationError(
            f"accelerator {self.name!r} is not available on this machine",
            value=self.name,
            choices=available,
            fix=f"use accelerator={available[0]!r}, or 'auto' for the best available",
        )
