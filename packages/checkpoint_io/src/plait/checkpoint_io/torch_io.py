"""Checkpoints as single ``torch.save`` files, written atomically, at paths or fsspec URLs."""

from __future__ import annotations

import io
import os
import pickle
import posixpath
import re
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol, cast

import torch
from typing_extensions import override

from plait.core import CheckpointError

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike

__all__ = ["TorchCheckpointIO"]

_UNSAFE_FIX = (
    "if you trust the file, load it with TorchCheckpointIO(weights_only=False); unpickling "
    "an untrusted file can run arbitrary code"
)


class FileSystem(Protocol):
    """The calls made to an fsspec filesystem (fsspec itself has no type information)."""

    protocol: str | tuple[str, ...]

    def isfile(self, path: str) -> bool: ...

    def exists(self, path: str) -> bool: ...

    def open(self, path: str, mode: str) -> IO[bytes]: ...

    def rm(self, path: str) -> None: ...

    def makedirs(self, path: str, exist_ok: bool) -> None: ...

    def pipe_file(self, path: str, value: bytes) -> None: ...

    def copy(self, path1: str, path2: str) -> None: ...


def filesystem(path: PathLike, storage_options: Mapping[str, object]) -> tuple[FileSystem, str]:
    # fsspec is imported on first use: plait.checkpoint_io imports fast without it.
    import fsspec.core  # noqa: PLC0415

    fs, resolved = fsspec.core.url_to_fs(os.fspath(path), **storage_options)
    return cast("FileSystem", fs), str(resolved)


def _is_local(fs: FileSystem) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return "file" in protocols


_PARTIAL = re.compile(r"^\..+\.[A-Za-z0-9_]+\.tmp$")
"""The name of a temporary file a local save writes before renaming it into place."""


def _temporary(path: Path) -> tuple[int, str]:
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")


def _refusal(error: BaseException) -> str:
    # torch's message ends with a documentation link; what was blocked is the line
    # of the unpickler's own error.
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("WeightsUnpickler error:"):
            return line.removeprefix("WeightsUnpickler error:").strip()
    return lines[-1] if lines else type(error).__name__


def _fsync_directory(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk too.
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class TorchCheckpointIO:
    """Saves and loads checkpoints with `torch.save` and `torch.load`.

    A save never leaves a truncated file at the final path and never destroys the
    previous checkpoint: locally it writes a temporary file in the same directory,
    syncs it to disk and renames it over the target (atomic on POSIX); on object
    stores (fsspec URLs such as ``s3://`` or ``memory://``) the whole file is put in
    one request. A process killed mid-save leaves the previous checkpoint intact, and
    at worst a hidden ``.<name>.*.tmp`` file beside it.

    Loading uses ``weights_only=True``: tensors, containers and plain Python values
    load, and nothing that could run code. ``weights_only=False`` unpickles anything,
    which is unsafe for files you did not write.

    Every record of the file carries a CRC-32 checksum (``torch.save`` writes a zip
    archive); loading verifies them all, so a file changed on disk after it was
    written (a flipped bit, a partial copy) is refused instead of loading wrong values.

    Args:
        weights_only: Refuse to unpickle anything but tensors and plain values.
        storage_options: Passed to fsspec for URLs (credentials, endpoints).
    """

    def __init__(
        self,
        *,
        weights_only: bool = True,
        storage_options: Mapping[str, object] | None = None,
    ) -> None:
        self.weights_only = weights_only
        self.storage_options = dict(storage_options or {})

    @property
    def format(self) -> str:
        """The checkpoint format it writes: ``"file"`` (`plait.core.SupportsFormat`)."""
        return "file"

    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Write ``checkpoint`` to ``path`` atomically, creating parent directories.

        Raises:
            CheckpointError: It cannot be serialised or written; the file at ``path``,
                if any, is left as it was.
        """
        fs, resolved = filesystem(path, self.storage_options)
        try:
            if _is_local(fs):
                self._save_local(dict(checkpoint), Path(resolved))
            else:
                buffer = io.BytesIO()
                torch.save(dict(checkpoint), buffer)
                fs.makedirs(posixpath.dirname(resolved), exist_ok=True)
                fs.pipe_file(resolved, buffer.getvalue())
        except (OSError, pickle.PicklingError, TypeError, AttributeError, RuntimeError) as error:
            raise CheckpointError(
                os.fspath(path),
                f"cannot be written: {type(error).__name__}: {error}",
                fix="keep only tensors and plain Python values in the checkpoint, and check "
                "that the directory is writable",
            ) from error

    @staticmethod
    def _save_local(checkpoint: Checkpoint, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = _temporary(path)
        try:
            with os.fdopen(descriptor, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        _fsync_directory(path.parent)

    def load_checkpoint(
        self, path: PathLike, map_location: torch.device | str | None = None
    ) -> Checkpoint:
        """Read the checkpoint at ``path``, placing tensors on ``map_location``.

        Raises:
            CheckpointError: It is missing, truncated, not a torch checkpoint, or holds
                objects that ``weights_only=True`` refuses (the message says how to
                load it anyway, and why that is unsafe).
        """
        fs, resolved = filesystem(path, self.storage_options)
        where = os.fspath(path)
        if not fs.isfile(resolved):
            if fs.exists(resolved):
                raise CheckpointError(
                    where,
                    "is a directory, not a checkpoint file",
                    fix="pass the path of a checkpoint file in it (a directory of shards "
                    "loads through strategy.load_checkpoint, or DistributedCheckpointIO)",
                )
            raise CheckpointError(
                where,
                "does not exist",
                fix="check the path; a checkpoint is saved by save_checkpoint",
            )
        try:
            with fs.open(resolved, "rb") as file:
                self._verify(file, where)
                file.seek(0)
                loaded = torch.load(file, map_location=map_location, weights_only=self.weights_only)
        except pickle.UnpicklingError as error:
            if "Weights only load failed" in str(error):
                raise CheckpointError(
                    where,
                    f"holds objects that weights_only=True refuses to unpickle ({_refusal(error)})",
                    fix=_UNSAFE_FIX,
                ) from error
            raise self._unreadable(where, error) from error
        except (RuntimeError, EOFError, ValueError, OSError) as error:
            raise self._unreadable(where, error) from error
        if not isinstance(loaded, dict):
            raise CheckpointError(
                where,
                f"holds a {type(loaded).__name__}, not a checkpoint dictionary",
                fix="save checkpoints with save_checkpoint, which writes a dictionary",
            )
        return loaded

    @classmethod
    def _verify(cls, file: IO[bytes], where: str) -> None:
        # torch.save writes a zip archive: a truncated one has lost its directory,
        # which sits at the end, and each record's CRC-32 fails on a changed byte.
        try:
            with zipfile.ZipFile(file) as archive:
                damaged = archive.testzip()
        except zipfile.BadZipFile:
            raise cls._unreadable(where, ValueError("not a complete zip archive")) from None
        if damaged is not None:
            raise CheckpointError(
                where,
                f"is corrupt: the checksum of its record {damaged!r} does not match its "
                "contents (the file changed after it was written)",
                fix="load an earlier checkpoint, or copy this one again from its source",
            )

    @staticmethod
    def _unreadable(where: str, error: BaseException) -> CheckpointError:
        return CheckpointError(
            where,
            f"is truncated or not a torch checkpoint ({type(error).__name__}: {error})",
            fix="load an earlier checkpoint; a file written by save_checkpoint is complete "
            "or absent, never partial",
        )

    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete the checkpoint file at ``path``.

        Raises:
            CheckpointError: It does not exist.
        """
        fs, resolved = filesystem(path, self.storage_options)
        if not fs.isfile(resolved):
            raise CheckpointError(os.fspath(path), "cannot be removed: it does not exist")
        fs.rm(resolved)

    def copy_checkpoint(self, source: PathLike, destination: PathLike) -> None:
        """Make ``destination`` the same checkpoint as ``source``, replacing it atomically.

        Locally this is a hard link (no second copy of the data) renamed over the
        destination, or a copy where links are not possible; on object stores, the
        store's own copy.

        Raises:
            CheckpointError: ``source`` does not exist, or the copy cannot be made.
        """
        fs, resolved = filesystem(source, self.storage_options)
        target_fs, target = filesystem(destination, self.storage_options)
        if not fs.isfile(resolved):
            raise CheckpointError(os.fspath(source), "cannot be copied: it does not exist")
        try:
            if _is_local(fs) and _is_local(target_fs):
                self._copy_local(Path(resolved), Path(target))
            else:
                target_fs.makedirs(posixpath.dirname(target), exist_ok=True)
                target_fs.copy(resolved, target)
        except OSError as error:
            raise CheckpointError(
                os.fspath(destination),
                f"cannot be made from {os.fspath(source)!r}: {type(error).__name__}: {error}",
                fix="check that the directory is writable",
            ) from error

    @staticmethod
    def _copy_local(source: Path, destination: Path) -> None:
        destination.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = _temporary(destination)
        os.close(descriptor)
        try:
            os.unlink(temporary)
            try:
                os.link(source, temporary)
            except OSError:  # another filesystem, or one without hard links
                shutil.copyfile(source, temporary)
            os.replace(temporary, destination)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        _fsync_directory(destination.parent)

    def remove_partial(self, directory: PathLike) -> list[str]:
        """Delete the temporary files that saves killed midway left in ``directory``.

        Only local directories hold them (a save to an object store is one request).
        Call it where no save is in progress, as `ModelCheckpoint` does when a run
        starts.
        """
        fs, resolved = filesystem(directory, self.storage_options)
        folder = Path(resolved)
        if not _is_local(fs) or not folder.is_dir():
            return []
        removed = []
        for entry in folder.iterdir():
            if _PARTIAL.match(entry.name) and entry.is_file():
                entry.unlink(missing_ok=True)
                removed.append(str(entry))
        return sorted(removed)

    def teardown(self) -> None:
        """Nothing to release: every save completes before it returns."""

    @override
    def __repr__(self) -> str:
        return f"TorchCheckpointIO(weights_only={self.weights_only})"
