"""What every XLA strategy does alike: the device loader, graph cuts, settled checkpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from typing_extensions import override

from plait.core import TrainingSemantics
from plait.strategies.base import BaseStrategy
from plait.strategies.xla import library

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    import torch

    from plait.core.typing import Checkpoint, PathLike

__all__ = ["OnXLADevice"]


class OnXLADevice(BaseStrategy):
    """A strategy's part that XLA devices need, whatever the strategy's layout.

    Listed before the strategy's other base (``class S(OnXLADevice, SingleDeviceStrategy)``).
    """

    _xla: library.TorchXLA

    @property
    @override
    def training_semantics(self) -> TrainingSemantics:
        """Synchronous replicas; no strategy of another device type to move to."""
        return TrainingSemantics()

    def process_dataloader(self, loader: Iterable[object]) -> Iterable[object]:
        """``loader`` inside torch_xla's device loader.

        Batches are copied to the device in the background while a step runs.
        """
        return library.parallel_loader().MpDeviceLoader(loader, self.root_device)

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
    def load_checkpoint(
        self,
        path: PathLike,
        state: torch.nn.Module | Mapping[str, object] | None = None,
        *,
        weights_only: bool = False,
        strict: bool = True,
    ) -> Checkpoint:
        """Restore the checkpoint at ``path`` once the device has finished its work."""
        self._xla.sync(wait=True)
        return super().load_checkpoint(path, state, weights_only=weights_only, strict=strict)

    @override
    def read_checkpoint(
        self, path: PathLike, module: torch.nn.Module | None = None, *, weights_only: bool = False
    ) -> Checkpoint:
        """Read the checkpoint at ``path`` once the device has finished its work."""
        self._xla.sync(wait=True)
        return super().read_checkpoint(path, module, weights_only=weights_only)
