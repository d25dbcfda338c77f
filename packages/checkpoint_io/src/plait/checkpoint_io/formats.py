"""The checkpoint formats this package writes, readable whole in one process by any strategy.

``"file"``: one ``torch.save`` file (`TorchCheckpointIO`, `AsyncCheckpointIO`,
`XLACheckpointIO`), at a path or an fsspec URL. ``"distributed"``: a
``torch.distributed.checkpoint`` directory (`DistributedCheckpointIO`), complete once
its ``.metadata`` is written. Both are registered in
`plait.core.CheckpointFormatRegistry`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from typing_extensions import override

from plait.checkpoint_io.sharded import DistributedCheckpointIO, read_whole
from plait.checkpoint_io.torch_io import TorchCheckpointIO, filesystem
from plait.core import CheckpointError

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike

__all__ = ["DistributedFormat", "FileFormat"]

# torch.save writes a zip archive; files of torch before 1.6 (and _use_new_zipfile_serialization
# =False) are a pickle, whose first byte is the PROTO opcode.
_ZIP: Final = b"PK\x03\x04"
_PICKLE: Final = b"\x80"


def _without_optimizers(checkpoint: Checkpoint, optimizers: bool) -> Checkpoint:
    if not optimizers:
        checkpoint.pop("optimizer_states", None)
    return checkpoint


def _write(checkpoint: Mapping[str, object], output: PathLike) -> None:
    # Atomic, like every save: a consolidation stopped half-way leaves no partial file.
    TorchCheckpointIO().save_checkpoint(checkpoint, output)


def _module_state(checkpoint: Mapping[str, object], path: PathLike) -> Mapping[str, object]:
    state = checkpoint.get("state_dict")
    if not isinstance(state, Mapping):
        raise CheckpointError(
            os.fspath(path),
            "holds no module state ('state_dict')",
            fix="pass a checkpoint saved with the module in it "
            "(save_checkpoint({'model': model, ...}, path))",
        )
    return state


class FileFormat:
    """One ``torch.save`` file, at a local path or an fsspec URL."""

    @property
    def name(self) -> str:
        """``"file"``."""
        return "file"

    def recognizes(self, path: PathLike) -> bool:
        """Whether ``path`` is a file that starts as ``torch.save`` writes one."""
        try:
            fs, resolved = filesystem(path, {})
            if not fs.isfile(resolved):
                return False
            with fs.open(resolved, "rb") as file:
                head = file.read(len(_ZIP))
        except (OSError, ValueError, ImportError):
            return False
        return head == _ZIP or head.startswith(_PICKLE)

    def read_whole(self, path: PathLike, *, optimizers: bool = True) -> Checkpoint:
        """The file's checkpoint, its tensors on the CPU (tensors and plain values only)."""
        read = TorchCheckpointIO().load_checkpoint(path, map_location="cpu")
        return _without_optimizers(read, optimizers)

    def consolidate(self, path: PathLike, output: PathLike, *, weights_only: bool = False) -> None:
        """Write the file again at ``output`` (its module's state alone with ``weights_only``)."""
        whole = TorchCheckpointIO(weights_only=False).load_checkpoint(path, map_location="cpu")
        state = _module_state(whole, path)
        _write({"state_dict": state} if weights_only else whole, output)

    @override
    def __repr__(self) -> str:
        return "FileFormat()"


class DistributedFormat:
    """A ``torch.distributed.checkpoint`` directory: each rank's shards and a ``.metadata``."""

    @property
    def name(self) -> str:
        """``"distributed"``."""
        return "distributed"

    def recognizes(self, path: PathLike) -> bool:
        """Whether ``path`` is a local directory with a ``.metadata`` (written last)."""
        if "://" in os.fspath(path):
            return False
        return (Path(path) / ".metadata").is_file()

    def read_whole(self, path: PathLike, *, optimizers: bool = True) -> Checkpoint:
        """Every shard gathered into one state, on the CPU."""
        read = DistributedCheckpointIO().load_checkpoint(path, map_location="cpu")
        return _without_optimizers(read, optimizers)

    def consolidate(self, path: PathLike, output: PathLike, *, weights_only: bool = False) -> None:
        """Gather every shard into one ``torch.save`` file at ``output``."""
        whole = read_whole(path, "cpu", weights_only=False)
        state = _module_state(whole, path)
        _write({"state_dict": state} if weights_only else whole, output)

    @override
    def __repr__(self) -> str:
        return "DistributedFormat()"
