"""Any checkpoint a strategy writes, read whole or written as one plain file, by its format."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from plait.core import (
    CheckpointError,
    CheckpointFormat,
    CheckpointFormatRegistry,
    detect_checkpoint_format,
)

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike

__all__ = ["consolidate_checkpoint", "format_of", "read_whole", "write_file"]


def format_of(path: PathLike) -> CheckpointFormat:
    """The registered format of the checkpoint at ``path``.

    Raises:
        CheckpointError: No registered format recognises it (the registered ones
            are listed).
    """
    found = detect_checkpoint_format(path)
    if found is not None:
        return found
    where = os.fspath(path)
    formats = ", ".join(CheckpointFormatRegistry.available())
    if "://" not in where and not Path(where).exists():
        raise CheckpointError(
            where, "does not exist", fix="pass the path save_checkpoint was given"
        )
    raise CheckpointError(
        where,
        f"is a checkpoint of no registered format (the formats: {formats}); a directory "
        "whose save did not complete has no format yet"
        + (", and a URL that names nothing has none" if "://" in where else ""),
        fix="pass a checkpoint a strategy wrote (an incomplete one, from a run stopped while "
        "saving, cannot be read: use an earlier one), or register the format that wrote it "
        "in plait.core.CheckpointFormatRegistry",
    )


def read_whole(path: PathLike, *, optimizers: bool = True) -> Checkpoint:
    """Read a checkpoint of any registered format whole into this process, on the CPU.

    For a strategy meeting another strategy's checkpoint, and for a look at one
    outside any run: the module's state under ``"state_dict"``, the optimizers'
    under ``"optimizer_states"`` (unless ``optimizers`` is false) and the run's
    entries, however the strategy that wrote it held them (shards, ZeRO's
    partitions rebuilt in fp32).

    Raises:
        CheckpointError: It is of no registered format, or cannot be read.
    """
    return format_of(path).read_whole(path, optimizers=optimizers)


def consolidate_checkpoint(
    checkpoint: PathLike, output: PathLike, *, weights_only: bool = False
) -> None:
    """Write ``checkpoint`` as one ``torch.save`` file that a plain module loads.

    One function for every checkpoint a strategy writes, whatever the strategy and
    world size, through its registered format (`plait.core.CheckpointFormatRegistry`):
    one file (single device, DDP, a full FSDP state), a `torch.distributed.checkpoint`
    directory (FSDP's or a mesh's shards; ``"distributed"`` checkpoint IO), a
    DeepSpeed directory (ZeRO's partitions, rebuilt in fp32), or a format a third
    party registered. It runs in one process, without a process group, and reads the
    whole state into this process's memory. The file holds ``{"state_dict": ...}``
    with the user module's keys::

        model.load_state_dict(torch.load(output)["state_dict"])

    Args:
        checkpoint: The checkpoint: a file or a directory.
        output: The file to write.
        weights_only: Keep the module's state alone, not the optimizers' and the
            run's entries.

    Raises:
        CheckpointError: ``checkpoint`` is of no registered format, or incomplete,
            or ``output`` cannot be written.
    """
    format_of(checkpoint).consolidate(checkpoint, output, weights_only=weights_only)


def write_file(checkpoint: Mapping[str, object], output: PathLike) -> None:
    """``torch.save`` ``checkpoint`` to ``output``.

    Raises:
        CheckpointError: ``output`` cannot be written.
    """
    try:
        torch.save(dict(checkpoint), os.fspath(output))
    except OSError as error:
        raise CheckpointError(
            os.fspath(output), f"cannot be written: {error}", fix="check its directory exists"
        ) from error
