"""Registers the built-in strategies (entry point ``plait.strategies``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait.strategies.single_device import SingleDeviceStrategy

if TYPE_CHECKING:
    from plait.core import Registry, Strategy

__all__ = ["register"]


def register(registry: Registry[Strategy]) -> None:
    """Register the strategies that run without a launcher of plait's own."""
    registry.register(
        "single_device", SingleDeviceStrategy, description="one process on one device"
    )
