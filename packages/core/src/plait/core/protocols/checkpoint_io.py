"""The CheckpointIO protocol: writing and reading checkpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from plait.core.typing import Checkpoint, PathLike, StateDict

__all__ = [
    "CheckpointIO",
    "SupportsAsyncCheckpoint",
    "SupportsCollectiveIO",
    "SupportsCopyCheckpoint",
    "SupportsLoadInPlace",
    "SupportsPartialCleanup",
    "is_collective",
]


@runtime_checkable
class CheckpointIO(Protocol):
    """Writes, reads and removes checkpoints at local paths or fsspec URLs."""

    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Write ``checkpoint`` to ``path``; an existing file there is replaced whole.

        Raises:
            CheckpointError: It cannot be written.
        """
        ...

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: torch.device | str | None = None,
    ) -> Checkpoint:
        """Read the checkpoint at ``path``, placing tensors on ``map_location``.

        Raises:
            CheckpointError: It is missing, truncated or not a checkpoint.
        """
        ...

    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete the checkpoint at ``path``.

        Raises:
            CheckpointError: It does not exist or cannot be removed.
        """
        ...

    def teardown(self) -> None:
        """Finish pending work and release resources."""
        ...


@runtime_checkable
class SupportsAsyncCheckpoint(Protocol):
    """A checkpoint IO whose saves complete in the background."""

    def wait(self) -> None:
        """Block until every save started so far is durable on storage.

        Raises:
            CheckpointError: A background save failed.
        """
        ...


@runtime_checkable
class SupportsLoadInPlace(Protocol):
    """A checkpoint IO that loads into existing (possibly sharded) tensors.

    Strategies whose state is sharded across ranks load this way: each rank reads
    only the shards its tensors hold.
    """

    def load_checkpoint_into(self, path: PathLike, state_dict: StateDict) -> Checkpoint:
        """Fill the tensors of ``state_dict`` in place from the checkpoint at ``path``.

        Returns:
            The checkpoint: ``state_dict``'s entries (filled in place), and every other
            top-level entry of the checkpoint, read whole.

        Raises:
            CheckpointError: It is missing, incomplete or lacks a key of ``state_dict``.
        """
        ...


@runtime_checkable
class SupportsCollectiveIO(Protocol):
    """A checkpoint IO that says whether every rank calls it.

    A collective IO (``collective`` true) is called by every rank to save, load and
    remove, each rank writing or reading its own part; any other is called by
    global rank 0 alone to save and remove. An IO that does not say is rank-0.
    """

    @property
    def collective(self) -> bool:
        """Whether every rank calls `save_checkpoint` and `remove_checkpoint`."""
        ...


@runtime_checkable
class SupportsCopyCheckpoint(Protocol):
    """A checkpoint IO that can give a saved checkpoint a second name cheaply.

    ``ModelCheckpoint`` writes the epoch's checkpoint once and makes ``last.ckpt``
    from it this way, instead of serialising the whole state a second time.
    """

    def copy_checkpoint(self, source: PathLike, destination: PathLike) -> None:
        """Make ``destination`` hold the checkpoint at ``source``, replacing it whole.

        The destination is never partial: it is the old file or the new one.

        Raises:
            CheckpointError: ``source`` does not exist, or the copy cannot be made.
        """
        ...


@runtime_checkable
class SupportsPartialCleanup(Protocol):
    """A checkpoint IO whose interrupted saves can leave files behind, and clean them."""

    def remove_partial(self, directory: PathLike) -> list[str]:
        """Delete what interrupted saves left in ``directory``; return the paths removed."""
        ...


def is_collective(checkpoint_io: object) -> bool:
    """Whether every rank calls ``checkpoint_io`` to save and remove (else rank 0 alone)."""
    return isinstance(checkpoint_io, SupportsCollectiveIO) and bool(checkpoint_io.collective)
