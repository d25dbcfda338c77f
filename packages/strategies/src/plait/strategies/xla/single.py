"""One process on one XLA device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from plait.strategies.single_device import SingleDeviceStrategy
from plait.strategies.xla import library
from plait.strategies.xla.device import OnXLADevice

if TYPE_CHECKING:
    from collections.abc import Callable

    from plait.core import Accelerator, CheckpointIO, Precision

__all__ = ["SingleDeviceXLAStrategy"]


class SingleDeviceXLAStrategy(OnXLADevice, SingleDeviceStrategy):
    """Train in this process on one XLA device (a TPU core, or XLA on GPU or CPU).

    XLA traces operations into a graph and runs it when asked: the strategy cuts the
    graph after every optimizer step, so each step is one compiled program, the same
    from step to step once the shapes settle. Checkpoints are copied to the CPU
    before they are written (the ``"xla"`` checkpoint IO), so they load anywhere.

    Args:
        device: The XLA device; this process's first by default.
        accelerator: The accelerator, or its name; ``"xla"`` by default.
        precision: The precision plugin, or its name; ``"32-true"`` by default.
        precision_plugin: The same, under the name Lightning's strategies take it by.
        checkpoint_io: The checkpoint IO, or its name; ``"xla"`` by default.

    Raises:
        ConfigurationError: torch_xla is not installed (the message names the extra),
            or does not import beside this torch, or ``device`` is not an XLA device.
    """

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        accelerator: Accelerator | str | None = None,
        precision: Precision | str | None = None,
        precision_plugin: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
    ) -> None:
        xla = library.import_torch_xla()
        chosen = xla.device() if device is None else torch.device(device)
        library.require_xla_device(chosen)
        self._xla = xla
        super().__init__(
            chosen,
            accelerator=accelerator,
            precision=precision,
            precision_plugin=precision_plugin,
            checkpoint_io=checkpoint_io or "xla",
        )

    @override
    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], object] | None = None,
    ) -> object:
        """Step ``optimizer``, then run the step's graph on the device."""
        result = super().optimizer_step(optimizer, closure)
        self._xla.sync()
        return result

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={str(self.root_device)!r})"
