"""Sharded checkpoints with ``torch.distributed.checkpoint``: every rank writes its part."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.checkpoint_io.structure import (
    Digest,
    decoded,
    differing,
    encoded,
    plain_tensor_digests,
)
from plait.core import CheckpointError
from plait.core.checkpoint_dirs import check, clean_interrupted, partial_of, seal

if TYPE_CHECKING:
    from torch.distributed.checkpoint.planner import LoadPlanner, SavePlanner

    from plait.core.typing import Checkpoint, PathLike, StateDict

__all__ = ["DistributedCheckpointIO", "read_whole"]


# torch.distributed.checkpoint is imported where it is used: it takes about a second
# to import, which every process that builds a strategy would otherwise pay.


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _single_process_notice_silenced() -> Iterator[None]:
    # DCP warns on every call without a process group, even when that is asked for;
    # working in one process then is this class's documented behaviour.
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        warnings.filterwarnings(
            "ignore", message="torch.distributed is unavailable or uninitialized"
        )
        yield


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _ranks(group: list[int]) -> str:
    return f"rank {group[0]}" if len(group) == 1 else f"ranks {', '.join(map(str, group))}"


def _is_rank_zero() -> bool:
    return not _distributed() or dist.get_rank() == 0


def read_whole(
    path: PathLike, map_location: torch.device | str | None, *, weights_only: bool
) -> Checkpoint:
    """The checkpoint directory ``path`` gathered whole in this process, as it was saved.

    ``weights_only=False`` unpickles any object it holds (unsafe for directories you
    did not write).

    Raises:
        CheckpointError: It is missing or incomplete.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: PLC0415

    DistributedCheckpointIO.require_complete(path)
    check(path, collective=False)  # this process reads every file
    with tempfile.TemporaryDirectory(prefix="plait-dcp-") as scratch:
        converted = Path(scratch) / "full.pt"
        dcp_to_torch_save(os.fspath(path), converted)
        loaded = torch.load(converted, map_location=map_location, weights_only=weights_only)
    return cast("Checkpoint", decoded(loaded))


class DistributedCheckpointIO:
    """Checkpoints as ``torch.distributed.checkpoint`` directories, for sharded state.

    Saving and loading are collective: every rank of the process group calls them,
    and each writes or reads only the shards it holds (tensors that are replicated are
    written once). Without a process group, one process does all of it.

    A checkpoint is a directory on a filesystem every rank sees. It is written under
    ``<path>.partial`` and put in place by rank 0 once every rank has written (DCP
    writes its ``.metadata`` last), so an interrupted save leaves the previous
    checkpoint intact; `remove_partial` cleans what it left. The size and CRC-32 of
    every file, ``.metadata`` included, are kept beside them
    (`plait.core.checkpoint_dirs.MANIFEST`) and checked before every load: a changed,
    truncated or missing file is refused, naming it. The ranks share the reading.

    Strategies load in place with `load_checkpoint_into` (each rank reads only
    what its tensors hold); `load_checkpoint` reads a full, unsharded copy, for
    inspection and conversion.

    Args:
        save_planner: Makes the DCP save planner of each save (DCP's default
            without it), e.g. torch_xla's ``SPMDSavePlanner`` for SPMD-sharded tensors.
        load_planner: Makes the DCP load planner of each in-place load, likewise.
    """

    collective = True
    """Every rank calls `save_checkpoint`, `load_checkpoint_into` and `remove_checkpoint`."""
    format = "distributed"
    """The checkpoint format it writes (`plait.core.SupportsFormat`)."""

    def __init__(
        self,
        *,
        save_planner: Callable[[], SavePlanner] | None = None,
        load_planner: Callable[[], LoadPlanner] | None = None,
    ) -> None:
        self.save_planner = save_planner
        self.load_planner = load_planner

    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Write ``checkpoint`` (collectively) to the directory ``path``.

        Raises:
            CheckpointError: It cannot be written.
        """
        from torch.distributed.checkpoint.api import CheckpointException  # noqa: PLC0415
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # noqa: PLC0415

        target = Path(path)
        partial = partial_of(target)
        writable = self._writable(checkpoint, path)
        try:
            if _is_rank_zero():
                shutil.rmtree(partial, ignore_errors=True)
            _barrier()
            with _single_process_notice_silenced():
                dcp_save(
                    writable,
                    checkpoint_id=partial,
                    no_dist=not _distributed(),
                    planner=None if self.save_planner is None else self.save_planner(),
                )
            # Every rank has written (DCP's .metadata last): digested and put in place.
            seal(partial, target)
            _barrier()
        # DCP gathers the ranks' failures into a CheckpointException, a BaseException.
        except (OSError, RuntimeError, ValueError, CheckpointException) as error:
            raise CheckpointError(
                os.fspath(path),
                f"cannot be written: {type(error).__name__}: {error}",
                fix="check that every rank sees the directory and can write to it",
            ) from error

    @staticmethod
    def _writable(checkpoint: Mapping[str, object], path: PathLike) -> Checkpoint:
        # Every rank learns every rank's verdict before any writes, so that a refusal
        # is raised on all of them (none waits for the others in DCP's collectives).
        refusal: CheckpointError | None = None
        writable: Checkpoint = {}
        try:
            writable = encoded(checkpoint, path)
        except CheckpointError as error:
            refusal = error
        if not _distributed() or dist.get_world_size() == 1:
            if refusal is not None:
                raise refusal
            return writable
        digests = plain_tensor_digests(writable) if refusal is None else {}
        verdicts: list[tuple[str | None, dict[str, Digest]] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(verdicts, (None if refusal is None else str(refusal), digests))
        if refusal is not None:
            raise refusal
        for rank, verdict in enumerate(verdicts):
            assert verdict is not None
            if verdict[0] is not None:
                raise CheckpointError(
                    os.fspath(path),
                    f"cannot be written: rank {rank} refused its part ({verdict[0]})",
                    fix=f"see rank {rank}'s error",
                )
        conflicts = differing([verdict[1] for verdict in verdicts if verdict is not None])
        if conflicts:
            shown = "; ".join(
                f"{where} ({' / '.join(map(_ranks, groups))})"
                for where, groups in sorted(conflicts.items())[:5]
            )
            raise CheckpointError(
                os.fspath(path),
                f"cannot be written: the ranks hold different values of tensors that are "
                f"not sharded, which a torch.distributed.checkpoint writes once, from one "
                f"rank: {shown}"
                + (f", and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""),
                fix="make the ranks agree before saving (broadcast from rank 0, or average), "
                "or keep per-rank values under a key of each rank's own (f'ema_rank{rank}'), "
                "or as a DTensor sharded over the ranks",
            )
        return writable

    def load_checkpoint_into(self, path: PathLike, state_dict: StateDict) -> Checkpoint:
        """Fill the tensors of ``state_dict`` in place (collectively) from ``path``.

        Returns:
            ``state_dict``'s entries, filled, with every other top-level entry of the
            checkpoint read whole.

        Raises:
            CheckpointError: The checkpoint is missing or incomplete, or lacks a key.
        """
        from torch.distributed.checkpoint.api import CheckpointException  # noqa: PLC0415
        from torch.distributed.checkpoint.filesystem import FileSystemReader  # noqa: PLC0415
        from torch.distributed.checkpoint.state_dict_loader import (  # noqa: PLC0415
            _load_state_dict_from_keys,
        )
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load  # noqa: PLC0415

        self.require_complete(path)
        check(path)
        try:
            with _single_process_notice_silenced():
                dcp_load(
                    state_dict,
                    checkpoint_id=os.fspath(path),
                    no_dist=not _distributed(),
                    planner=None if self.load_planner is None else self.load_planner(),
                )
                metadata = FileSystemReader(os.fspath(path)).read_metadata()
                mapping = metadata.planner_data or {}
                saved = {
                    str(mapping[key][0]) if key in mapping else key.split(".", 1)[0]
                    for key in metadata.state_dict_metadata
                }
                rest = saved - set(state_dict)
                others = (
                    _load_state_dict_from_keys(rest, checkpoint_id=os.fspath(path)) if rest else {}
                )
        except (RuntimeError, KeyError, ValueError, CheckpointException) as error:
            raise CheckpointError(
                os.fspath(path),
                f"cannot be loaded into the given state: {type(error).__name__}: {error}",
                fix="load into a state dictionary with the keys and shapes that were saved",
            ) from error
        return {**cast("Checkpoint", decoded(others)), **state_dict}

    def load_checkpoint(
        self, path: PathLike, map_location: torch.device | str | None = None
    ) -> Checkpoint:
        """Read a full, unsharded copy of the checkpoint into this process's memory.

        Raises:
            CheckpointError: It is missing or incomplete.
        """
        return read_whole(path, map_location, weights_only=True)

    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete the checkpoint directory (on rank 0; the others wait for it).

        Raises:
            CheckpointError: It does not exist.
        """
        target = Path(path)
        if not target.is_dir():
            raise CheckpointError(os.fspath(path), "cannot be removed: it does not exist")
        _barrier()
        if _is_rank_zero():
            shutil.rmtree(target)
        _barrier()

    def remove_partial(self, directory: PathLike) -> list[str]:
        """Remove what saves killed midway left in ``directory`` (see `clean_interrupted`).

        Call it where no save is in progress, as `ModelCheckpoint` does when a run
        starts (on rank 0).
        """
        return clean_interrupted(directory)

    def teardown(self) -> None:
        """Nothing to release: every save completes before it returns."""

    @staticmethod
    def require_complete(path: PathLike) -> None:
        """Refuse a path that is not a complete checkpoint directory.

        Raises:
            CheckpointError: It does not exist, is not a directory, or has no ``.metadata``.
        """
        target = Path(path)
        if not target.is_dir():
            raise CheckpointError(
                os.fspath(path),
                "does not exist" if not target.exists() else "is not a checkpoint directory",
                fix="check the path; sharded checkpoints are directories",
            )
        if not (target / ".metadata").is_file():
            raise CheckpointError(
                os.fspath(path),
                "is incomplete: it has no .metadata, which is written last",
                fix="load an earlier checkpoint",
            )

    @override
    def __repr__(self) -> str:
        given = (("save_planner", self.save_planner), ("load_planner", self.load_planner))
        planners = [
            f"{name}={getattr(made, '__name__', made)!s}"
            for name, made in given
            if made is not None
        ]
        return f"DistributedCheckpointIO({', '.join(planners)})"
