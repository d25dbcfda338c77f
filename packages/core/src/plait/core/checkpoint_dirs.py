"""Checkpoints that are directories of parts: written aside, put in place whole, checked.

A checkpoint many ranks write (``torch.distributed.checkpoint``'s shards, a DeepSpeed
engine's partitions) is a directory. The checkpoint IOs that write one use these
helpers, so that every such checkpoint keeps the same promises:

- It is written under ``<path>.partial`` and put in place only once every rank has
  written (`replace_directory`): a save killed midway leaves the previous checkpoint
  whole, and nothing incomplete under a checkpoint's name. `clean_interrupted`
  removes what such a save left, when the next run starts.
- Before it is put in place, the size and CRC-32 of every file in it are written to
  `MANIFEST` (`write_manifest`); a load first checks them (`verify_manifest`), so a
  flipped byte, a truncated or a missing file is refused, naming the file, and never
  loaded. The ranks share the reading: each digests and checks the files of its own
  share (`share_of`), so the whole directory is read once, not once per rank.

`seal` (once every rank has written) and `check` (before a load) do each of those for
every rank of the default process group, or for the one process without one.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final, TypeVar, cast

from plait.core.errors import CheckpointError
from plait.core.rank import rank_zero_warn

__all__ = [
    "MANIFEST",
    "PARTIAL_SUFFIX",
    "PREVIOUS_SUFFIX",
    "Digests",
    "check",
    "clean_interrupted",
    "damaged",
    "digest_files",
    "files_of",
    "partial_of",
    "replace_directory",
    "seal",
    "share_of",
    "verify_manifest",
    "write_manifest",
]

PARTIAL_SUFFIX: Final = ".partial"
"""Appended to a checkpoint directory's name while its save is in progress."""
PREVIOUS_SUFFIX: Final = ".previous"
"""Appended to the name of the checkpoint a save replaces, for as long as it replaces it."""
MANIFEST: Final = ".plait-checksums.json"
"""The file in a checkpoint directory with every other file's size and CRC-32."""

_CHUNK: Final = 1 << 22
_RENAME_EXCHANGE: Final = 2
_AT_FDCWD: Final = -100

Digests = dict[str, tuple[int, int]]
"""Each file's path relative to the checkpoint directory: its size and CRC-32."""

_T = TypeVar("_T")


def partial_of(target: Path) -> Path:
    """Where the checkpoint directory ``target`` is written until it is complete."""
    return target.with_name(target.name + PARTIAL_SUFFIX)


def files_of(directory: Path) -> list[str]:
    """Every file under ``directory`` but the manifest, relative to it, sorted."""
    return sorted(
        str(path.relative_to(directory))
        for path in directory.rglob("*")
        if path.is_file() and path.name != MANIFEST
    )


def share_of(files: Sequence[str], rank: int, world_size: int) -> list[str]:
    """The files rank ``rank`` of ``world_size`` reads to digest or check (every world_size-th)."""
    return list(files[rank::world_size])


def _crc(path: Path) -> tuple[int, int]:
    crc, size = 0, 0
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def digest_files(directory: Path, files: Iterable[str]) -> Digests:
    """The size and CRC-32 of each of ``files`` (relative to ``directory``)."""
    return {name: _crc(directory / name) for name in files}


def write_manifest(directory: Path, digests: Mapping[str, tuple[int, int]]) -> None:
    """Write `MANIFEST` into ``directory``, synced, before the directory is put in place."""
    path = directory / MANIFEST
    entries = {name: {"size": size, "crc32": crc} for name, (size, crc) in sorted(digests.items())}
    with path.open("w", encoding="utf-8") as stream:
        json.dump({"format": 1, "files": entries}, stream, indent=1)
        stream.flush()
        os.fsync(stream.fileno())


def verify_manifest(directory: Path, rank: int = 0, world_size: int = 1) -> list[str]:
    """Check this rank's share of the files `MANIFEST` lists; what is wrong with them.

    Each problem names the file. A directory without a manifest (written by another
    program) has nothing to check: an empty list. Missing files are found by every
    rank (the check is cheap); sizes and checksums by each rank for its share.
    """
    path = directory / MANIFEST
    if not path.is_file():
        return []
    try:
        listed = json.loads(path.read_text(encoding="utf-8"))["files"]
        expected = {
            name: (int(entry["size"]), int(entry["crc32"])) for name, entry in listed.items()
        }
    except (OSError, ValueError, KeyError, TypeError) as error:
        return [f"its {MANIFEST} cannot be read ({type(error).__name__}: {error})"]
    problems = [f"{name} is missing" for name in expected if not (directory / name).is_file()]
    for name in share_of(sorted(expected), rank, world_size):
        file = directory / name
        if not file.is_file():
            continue
        size, crc = expected[name]
        actual = file.stat().st_size
        if actual != size:
            problems.append(f"{name} has {actual} bytes, and {size} were written (truncated?)")
        elif _crc(file)[1] != crc:
            problems.append(f"{name} does not match its CRC-32 (changed on disk)")
    return problems


def damaged(path: str | os.PathLike[str], problems: Sequence[str]) -> CheckpointError:
    """The error for a checkpoint directory whose files do not match its manifest."""
    shown = "; ".join(problems[:5]) + (
        f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
    )
    return CheckpointError(
        os.fspath(path),
        f"is damaged: {shown}",
        fix="resume from an earlier checkpoint (pass its path as ckpt_path), or restore "
        "the file from a copy",
    )


def seal(partial: Path, target: Path) -> None:
    """Keep the digests of the complete ``partial`` beside its files, then put it in place.

    Collective where a process group is up: every rank calls it once every rank has
    written. Each digests its share of the files; rank 0 writes `MANIFEST` and puts
    the directory in place as ``target`` (`replace_directory`). Callers that load
    right after wait for rank 0 (a barrier).
    """
    rank, world_size = _group()
    shares = _everyones(digest_files(partial, share_of(files_of(partial), rank, world_size)))
    if rank == 0:
        write_manifest(partial, {name: kept for share in shares for name, kept in share.items()})
        replace_directory(partial, target)


def check(path: str | os.PathLike[str], *, collective: bool = True) -> None:
    """Refuse the checkpoint directory ``path`` if a file does not match `MANIFEST`.

    With ``collective`` and a process group up, every rank calls it, checks its share
    of the files, and every rank raises the same error for what any rank found;
    otherwise this process checks every file.

    Raises:
        CheckpointError: A file is changed, truncated or missing (each named).
    """
    rank, world_size = _group() if collective else (0, 1)
    found = verify_manifest(Path(path), rank, world_size)
    shares = _everyones(found) if collective else [found]
    problems = sorted({problem for share in shares for problem in share})
    if problems:
        raise damaged(path, problems)


def _group() -> tuple[int, int]:
    # This rank and the world size of the default process group; one process without.
    import torch.distributed as dist  # noqa: PLC0415 (plait.core does not import torch)

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _everyones(value: _T) -> list[_T]:
    # Every rank's ``value``, in rank order, on every rank.
    import torch.distributed as dist  # noqa: PLC0415 (plait.core does not import torch)

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    gathered: list[_T | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return [cast("_T", each) for each in gathered]


def replace_directory(partial: Path, target: Path) -> None:
    """Put the complete checkpoint directory ``partial`` in place as ``target``.

    A new ``target`` is one rename. An existing one is exchanged with ``partial`` in
    one atomic step where the system can (Linux's ``renameat2``), then removed;
    elsewhere it is renamed aside to ``<target>.previous`` first, and a save killed
    between the two renames leaves that complete checkpoint for `clean_interrupted`
    to put back.
    """
    _fsync_tree(partial)
    if not target.exists():
        partial.rename(target)
    elif _exchange(partial, target):
        shutil.rmtree(partial, ignore_errors=True)  # now the replaced checkpoint
    else:
        previous = target.with_name(target.name + PREVIOUS_SUFFIX)
        shutil.rmtree(previous, ignore_errors=True)
        target.rename(previous)
        partial.rename(target)
        shutil.rmtree(previous, ignore_errors=True)
    _fsync(target.parent)


def clean_interrupted(directory: str | os.PathLike[str]) -> list[str]:
    """Remove what interrupted saves of directory checkpoints left in ``directory``.

    A ``*.partial`` directory is removed. A ``<name>.previous`` is the complete
    checkpoint a save was replacing: removed when ``<name>`` is in place, put back
    as ``<name>`` when the save died between the two renames. Call it where no save
    is in progress (`ModelCheckpoint` does, when a run starts, on rank 0).

    Returns:
        The paths removed.
    """
    folder = Path(directory)
    if not folder.is_dir():
        return []
    removed = []
    for entry in sorted(folder.iterdir()):
        if not entry.is_dir():
            continue
        if entry.name.endswith(PARTIAL_SUFFIX):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(str(entry))
        elif entry.name.endswith(PREVIOUS_SUFFIX):
            original = entry.with_name(entry.name.removesuffix(PREVIOUS_SUFFIX))
            if original.exists():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(str(entry))
            else:
                entry.rename(original)
                rank_zero_warn(
                    f"put {original} back from {entry.name}: a save that was replacing it "
                    "was interrupted"
                )
    return removed


def _exchange(first: Path, second: Path) -> bool:
    # renameat2(RENAME_EXCHANGE): both names stay valid throughout. Linux 3.15 and
    # glibc 2.28 or later, on most local filesystems; False where it is not there.
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    done = renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    return bool(done == 0)


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # the C library loaded already
    except (OSError, AttributeError):
        return None
    text, number = ctypes.c_char_p, ctypes.c_int
    function.argtypes = [number, text, number, text, ctypes.c_uint]
    function.restype = number
    return cast("Callable[..., int]", function)


def _fsync_tree(directory: Path) -> None:
    for path in [*directory.rglob("*"), directory]:
        if path.is_dir():
            _fsync(path)


def _fsync(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # a filesystem that cannot sync a directory
    finally:
        os.close(descriptor)
