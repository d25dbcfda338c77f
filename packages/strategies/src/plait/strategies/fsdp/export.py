"""From a sharded checkpoint to one file: the whole state, for export."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from plait.core import CheckpointError

if TYPE_CHECKING:
    from plait.core.typing import PathLike

__all__ = ["consolidate_checkpoint"]


def consolidate_checkpoint(
    sharded: PathLike, output: PathLike, *, weights_only: bool = False
) -> None:
    """Write the sharded checkpoint directory ``sharded`` as one ``torch.save`` file.

    Runs in one process, without a process group; the whole state is read into this
    process's memory. The file loads with plain PyTorch:
    ``model.load_state_dict(torch.load(output)["state_dict"])``.

    Args:
        sharded: A checkpoint directory saved with ``state_dict_type="sharded"``.
        output: The file to write.
        weights_only: Keep only the module's state (``{"state_dict": ...}``), not the
            optimizers' and the run's.

    Raises:
        CheckpointError: ``sharded`` is missing or incomplete, or ``output`` cannot
            be written.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: PLC0415

    source = Path(sharded)
    if not (source / ".metadata").is_file():
        raise CheckpointError(
            os.fspath(sharded),
            "is not a complete sharded checkpoint: it has no .metadata",
            fix="pass a directory saved with state_dict_type='sharded'",
        )
    try:
        dcp_to_torch_save(source, os.fspath(output))
        if weights_only:
            whole = torch.load(os.fspath(output), map_location="cpu", weights_only=False)
            torch.save({"state_dict": whole["state_dict"]}, os.fspath(output))
    except OSError as error:
        raise CheckpointError(
            os.fspath(output), f"cannot be written: {error}", fix="check its directory exists"
        ) from error
