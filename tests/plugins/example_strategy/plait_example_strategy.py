"""A third party's strategy: one device, with a greeting, registered by entry point."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait.strategies import SingleDeviceStrategy

if TYPE_CHECKING:
    from plait.core import Registry, Strategy


class GreetingStrategy(SingleDeviceStrategy):
    """A single-device strategy that says hello; all else is inherited."""

    def greeting(self) -> str:
        """Say where it runs."""
        return f"hello from {self.root_device}"


def register(registry: Registry[Strategy]) -> None:
    """The entry point: register the strategy under its name."""
    registry.register("example_strategy", GreetingStrategy, description="a third party's strategy")
