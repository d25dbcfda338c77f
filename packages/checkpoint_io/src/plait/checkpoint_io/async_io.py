"""Saving checkpoints in a background thread, on a snapshot taken at call time."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from plait.checkpoint_io.torch_io import TorchCheckpointIO
from plait.core import CheckpointError, CheckpointIO, SupportsFormat

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike

__all__ = ["AsyncCheckpointIO", "StagingBuffers", "snapshot"]


class StagingBuffers:
    """CPU tensors a snapshot copies into, kept for the next snapshot of the same shapes.

    A copy into memory already mapped costs a third of one into fresh memory (whose
    pages the kernel maps on first touch). The buffers are taken in the order the
    snapshot meets the tensors; one of another shape or dtype is made anew.
    """

    def __init__(self) -> None:
        self._tensors: list[torch.Tensor] = []
        self._next = 0

    def start(self) -> None:
        """Begin a snapshot: its tensors take the buffers from the first."""
        self._next = 0

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``'s values in the next buffer (made if it does not fit)."""
        index, self._next = self._next, self._next + 1
        values = tensor.detach()
        if index < len(self._tensors):
            kept = self._tensors[index]
            if kept.shape == values.shape and kept.dtype == values.dtype:
                return kept.copy_(values)
        made = values.to("cpu", copy=True)
        if index < len(self._tensors):
            self._tensors[index] = made
        else:
            self._tensors.append(made)
        return made

    @property
    def nbytes(self) -> int:
        """The bytes the kept buffers hold."""
        return sum(tensor.nbytes for tensor in self._tensors)


def snapshot(value: object, buffers: StagingBuffers | None = None) -> object:
    """A copy of ``value`` that later changes to the original cannot reach.

    Tensors are detached and copied to the CPU (into ``buffers``, where given);
    dictionaries, lists and tuples are rebuilt around copies of their items;
    anything else is deep-copied.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True) if buffers is None else buffers.copy(value)
    if isinstance(value, Mapping):
        return {key: snapshot(item, buffers) for key, item in value.items()}
    if isinstance(value, list):
        return [snapshot(item, buffers) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(snapshot(item, buffers) for item in value)
    return copy.deepcopy(value)


class AsyncCheckpointIO:
    """Wraps another checkpoint IO so that saves run in a background thread.

    `save_checkpoint` returns once it has taken a snapshot of the checkpoint (tensors
    copied to the CPU), so training can change its parameters in place at once
    without the change reaching the file. Saves run one at a time, in order.

    A save that fails in the background is never lost: its error is raised, as a
    `CheckpointError`, by the next call (save, load, remove, `wait`) or at teardown.
    Loading and removing wait for pending saves first, so they see every save made
    before them. `teardown` finishes every save and stops the thread; a save after it
    starts a new one (a Trainer tears its strategy down after each ``validate`` or
    ``fit``, and the next one saves again).

    With ``keep_buffers``, the CPU copies of a snapshot are kept once its save is
    written, and the next snapshot copies into them: its call returns in a third of
    the time (``tools/bench --sections checkpoints``), for the state's size in CPU
    memory held between saves. A save started while the previous one still writes
    copies into new memory, as without it.

    Args:
        checkpoint_io: The IO that writes; `TorchCheckpointIO` by default.
        keep_buffers: Keep the snapshot's CPU copies between saves, to copy into.
    """

    def __init__(
        self, checkpoint_io: CheckpointIO | None = None, *, keep_buffers: bool = False
    ) -> None:
        self.checkpoint_io: CheckpointIO = checkpoint_io or TorchCheckpointIO()
        self.keep_buffers = keep_buffers
        self._buffers: StagingBuffers | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[tuple[str, Future[None]]] = []

    @property
    def format(self) -> str:
        """The format the wrapped IO writes (``"file"`` if it does not say)."""
        inner = self.checkpoint_io
        return inner.format if isinstance(inner, SupportsFormat) else "file"

    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Snapshot ``checkpoint`` and save it in the background.

        Raises:
            CheckpointError: An earlier background save failed.
        """
        self._raise_failures(block=False)
        buffers = None
        if self.keep_buffers:
            # Buffers a pending save still writes from are never copied into.
            if self._buffers is None or self._pending:
                self._buffers = StagingBuffers()
            buffers = self._buffers
            buffers.start()
        copied = snapshot(checkpoint, buffers)
        assert isinstance(copied, dict)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="plait-checkpoint"
            )
        future = self._executor.submit(self.checkpoint_io.save_checkpoint, copied, path)
        self._pending.append((os.fspath(path), future))

    def load_checkpoint(
        self, path: PathLike, map_location: torch.device | str | None = None
    ) -> Checkpoint:
        """Wait for pending saves, then load through the wrapped IO."""
        self.wait()
        return self.checkpoint_io.load_checkpoint(path, map_location)

    def remove_checkpoint(self, path: PathLike) -> None:
        """Wait for pending saves, then remove through the wrapped IO."""
        self.wait()
        self.checkpoint_io.remove_checkpoint(path)

    def wait(self) -> None:
        """Block until every save started so far is on storage.

        Raises:
            CheckpointError: A background save failed.
        """
        self._raise_failures(block=True)

    def teardown(self) -> None:
        """Finish every pending save, stop the thread, and tear down the wrapped IO.

        The IO stays usable: the next save starts a thread again.

        Raises:
            CheckpointError: A background save failed.
        """
        try:
            self.wait()
        finally:
            executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=True)
            self.checkpoint_io.teardown()

    def _raise_failures(self, *, block: bool) -> None:
        still_pending = []
        failures: list[tuple[str, BaseException]] = []
        for path, future in self._pending:
            if not block and not future.done():
                still_pending.append((path, future))
                continue
            error = future.exception()
            if error is not None:
                failures.append((path, error))
        self._pending = still_pending
        if not failures:
            return
        path, error = failures[0]
        if isinstance(error, CheckpointError) and len(failures) == 1:
            raise error
        later = ""
        if len(failures) > 1:
            later = f" (and {len(failures) - 1} later save(s) failed too: "
            later += ", ".join(other for other, _ in failures[1:]) + ")"
        raise CheckpointError(
            path, f"the background save failed: {type(error).__name__}: {error}{later}"
        ) from error

    @override
    def __repr__(self) -> str:
        kept = ", keep_buffers=True" if self.keep_buffers else ""
        return f"AsyncCheckpointIO({self.checkpoint_io!r}{kept})"
