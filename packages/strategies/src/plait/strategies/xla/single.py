"""One process on one XLA device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from plait.strategies.single_device import SingleDeviceStrategy
from plait.strategies.xla import library

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from plait.core import Accelerator, CheckpointIO, Precision
    from plait.core.typing import Checkpoint, PathLike

__all__ = ["SingleDeviceXLAStrategy"]


class SingleDeviceXLAStrategy(SingleDeviceStrategy):
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

    def process_dataloader(self, loader: Iterable[object]) -> Iterable[object]:
        """``loader`` inside torch_xla's device loader.

        Batches are copied to the device in the background while a step runs.
        """
        return library.parallel_loader().MpDeviceLoader(loader, self.root_device)

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
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Write ``checkpoint`` once the device has finished computing it.

        A checkpoint IO that reads device buffers directly (torch_xla's SPMD
        planner does) must not meet one in flight: the last step may still be
        running on the device when the loop saves.
        """
        self._xla.sync(wait=True)
        super().save_checkpoint(checkpoint, path)

    @override
    def load_checkpoint(self, path: PathLike, module: torch.nn.Module | None = None) -> Checkpoint:
        """Read the checkpoint at ``path`` once the device has finished its work."""
        self._xla.sync(wait=True)
        return super().load_checkpoint(path, module)

    @override
    def __repr__(self) -> str:
        return f"SingleDeviceXLAStrategy(device={str(self.root_device)!r})"
