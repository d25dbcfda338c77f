"""Any checkpoint plait writes: what it is, read whole, and written as one plain file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from plait.core import CheckpointError, CheckpointIORegistry

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike

__all__ = [
    "CheckpointFormat",
    "checkpoint_format",
    "consolidate_checkpoint",
    "read_whole",
    "write_file",
]

CheckpointFormat = Literal["deepspeed", "distributed", "file", "other"]


def checkpoint_format(path: PathLike) -> CheckpointFormat:
    """What wrote the checkpoint at ``path``, as far as its files say.

    ``"deepspeed"``: a directory DeepSpeed's engine wrote (it has ``latest``);
    ``"distributed"``: a `torch.distributed.checkpoint` directory (``.metadata``);
    ``"file"``: one local file; ``"other"``: anything else (a URL, a directory of
    another kind, nothing), for the checkpoint IO to read.
    """
    local = Path(os.fspath(path))
    if "://" in os.fspath(path):
        return "other"
    if local.is_file():
        return "file"
    if (local / "latest").is_file():
        return "deepspeed"
    if (local / ".metadata").is_file():
        return "distributed"
    return "other"


def read_whole(path: PathLike, *, optimizers: bool = True) -> Checkpoint:
    """Read a checkpoint of any format whole into this process, its tensors on the CPU.

    For a strategy meeting another strategy's checkpoint: a DeepSpeed directory
    gives its weights and its optimizer's state rebuilt whole from ZeRO's
    partitions (in fp32, keyed by parameter name) and the run's entries, a
    `torch.distributed.checkpoint` directory everything, gathered whole, and a file
    what it holds. Without ``optimizers``, a DeepSpeed directory's optimizer state
    is not rebuilt.

    Raises:
        CheckpointError: It cannot be read.
    """
    kind = checkpoint_format(path)
    if kind == "deepspeed":
        from plait.strategies.deepspeed.export import (  # noqa: PLC0415
            read_whole as read_deepspeed,
        )

        return read_deepspeed(path, optimizer=optimizers)
    io = CheckpointIORegistry.get("distributed" if kind == "distributed" else "torch")
    read: Checkpoint = io.load_checkpoint(path, map_location="cpu")
    return read


def consolidate_checkpoint(
    checkpoint: PathLike, output: PathLike, *, weights_only: bool = False
) -> None:
    """Write ``checkpoint`` as one ``torch.save`` file that a plain module loads.

    One function for every checkpoint a strategy writes, whatever the strategy and
    world size: one file (single device, DDP, a full FSDP state), a
    `torch.distributed.checkpoint` directory (FSDP's shards; ``"distributed"``
    checkpoint IO) or a DeepSpeed directory (ZeRO's partitions, rebuilt in fp32).
    It runs in one process, without a process group, and reads the whole state into
    this process's memory. The file holds ``{"state_dict": ...}`` with the user
    module's keys::

        model.load_state_dict(torch.load(output)["state_dict"])

    Args:
        checkpoint: The checkpoint: a file or a directory.
        output: The file to write.
        weights_only: Keep the module's state alone, not the optimizers' and the
            run's entries. A DeepSpeed checkpoint's optimizer state is rebuilt whole
            from ZeRO's partitions, in torch's layout keyed by parameter name.

    Raises:
        CheckpointError: ``checkpoint`` is none of these, or incomplete, or ``output``
            cannot be written.
    """
    source = Path(checkpoint)
    if source.is_dir():
        from plait.strategies.deepspeed.checkpoint_io import (  # noqa: PLC0415
            is_deepspeed_checkpoint,
        )

        if is_deepspeed_checkpoint(source):
            from plait.strategies.deepspeed.export import (  # noqa: PLC0415
                consolidate_checkpoint as consolidate_deepspeed,
            )

            consolidate_deepspeed(source, output, run_entries=not weights_only)
            return
        if (source / ".metadata").is_file():
            from plait.strategies.fsdp.export import (  # noqa: PLC0415
                consolidate_checkpoint as consolidate_distributed,
            )

            consolidate_distributed(source, output, weights_only=weights_only)
            return
        raise CheckpointError(
            os.fspath(checkpoint),
            "is a directory that is neither a torch.distributed.checkpoint (it has no "
            ".metadata) nor a DeepSpeed checkpoint (it has no 'latest')",
            fix="pass a checkpoint a strategy wrote; an incomplete one (a run stopped "
            "while saving) cannot be consolidated: use an earlier one",
        )
    if not source.is_file():
        raise CheckpointError(
            os.fspath(checkpoint),
            "does not exist",
            fix="pass the path save_checkpoint was given",
        )
    try:
        whole = torch.load(source, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as error:
        raise CheckpointError(
            os.fspath(checkpoint),
            f"is not a file torch.load reads: {error}",
            fix="pass a checkpoint a strategy wrote",
        ) from error
    if not isinstance(whole, Mapping) or not isinstance(whole.get("state_dict"), Mapping):
        raise CheckpointError(
            os.fspath(checkpoint),
            "holds no module state ('state_dict')",
            fix="pass a checkpoint saved with the module in it "
            "(save_checkpoint({'model': model, ...}, path))",
        )
    write_file({"state_dict": whole["state_dict"]} if weights_only else dict(whole), output)


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
