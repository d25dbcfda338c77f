"""DeepSpeed's checkpoint directory as a registered format, which every strategy reads.

A directory DeepSpeed's engine wrote holds a ``latest`` file that names the tag
directory of the newest save; ZeRO's partitions inside it are rebuilt whole, in one
process and without deepspeed, by `plait.strategies.deepspeed.export`, which is
imported only when such a checkpoint is read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from typing_extensions import override

from plait.strategies.deepspeed.layout import LATEST

if TYPE_CHECKING:
    from plait.core import CheckpointFormat, Registry
    from plait.core.typing import Checkpoint, PathLike

__all__ = ["LATEST", "DeepSpeedFormat", "register"]


class DeepSpeedFormat:
    """A checkpoint directory DeepSpeed's engine wrote: ZeRO's partitions under a tag."""

    @property
    def name(self) -> str:
        """``"deepspeed"``."""
        return "deepspeed"

    def recognizes(self, path: PathLike) -> bool:
        """Whether ``path`` is a local directory with DeepSpeed's ``latest`` file."""
        if "://" in os.fspath(path):
            return False
        return (Path(path) / LATEST).is_file()

    def read_whole(self, path: PathLike, *, optimizers: bool = True) -> Checkpoint:
        """The weights in fp32 and, with ``optimizers``, the optimizer's state, rebuilt whole."""
        from plait.strategies.deepspeed.export import read_whole  # noqa: PLC0415

        return read_whole(path, optimizer=optimizers)

    def consolidate(self, path: PathLike, output: PathLike, *, weights_only: bool = False) -> None:
        """Write the checkpoint as one ``torch.save`` file, its weights in fp32."""
        from plait.strategies.deepspeed.export import consolidate  # noqa: PLC0415

        consolidate(path, output, weights_only=weights_only)

    @override
    def __repr__(self) -> str:
        return "DeepSpeedFormat()"


def register(registry: Registry[CheckpointFormat]) -> None:
    """Register the ``deepspeed`` checkpoint format (entry point ``plait.checkpoint_formats``)."""
    registry.register(
        "deepspeed", DeepSpeedFormat, description="a DeepSpeed engine's checkpoint directory"
    )
