"""Registers the built-in checkpoint IO plugins and checkpoint formats (two entry points)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait.checkpoint_io.async_io import AsyncCheckpointIO
from plait.checkpoint_io.formats import DistributedFormat, FileFormat
from plait.checkpoint_io.sharded import DistributedCheckpointIO
from plait.checkpoint_io.torch_io import TorchCheckpointIO
from plait.checkpoint_io.xla_io import XLACheckpointIO

if TYPE_CHECKING:
    from plait.core import CheckpointFormat, CheckpointIO, Registry

__all__ = ["register", "register_formats"]


def register(registry: Registry[CheckpointIO]) -> None:
    """Register ``torch``, ``async``, ``distributed`` and ``xla``."""
    registry.register(
        "torch", TorchCheckpointIO, description="torch.save files, written atomically"
    )
    registry.register("async", AsyncCheckpointIO, description="torch files saved in the background")
    registry.register(
        "distributed", DistributedCheckpointIO, description="sharded torch.distributed.checkpoint"
    )
    registry.register(
        "xla", XLACheckpointIO, description="torch.save files of state copied off XLA devices"
    )


def register_formats(registry: Registry[CheckpointFormat]) -> None:
    """Register the ``file`` and ``distributed`` checkpoint formats."""
    registry.register("file", FileFormat, description="one torch.save file")
    registry.register(
        "distributed", DistributedFormat, description="a torch.distributed.checkpoint directory"
    )
