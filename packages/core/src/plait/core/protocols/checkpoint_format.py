"""The CheckpointFormat protocol: one way checkpoints lie on storage, readable in one process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike

__all__ = ["CheckpointFormat", "SupportsFormat"]


@runtime_checkable
class CheckpointFormat(Protocol):
    """One way checkpoints lie on storage: one file, a sharded directory, an engine's layout.

    A format is registered by name (`plait.core.CheckpointFormatRegistry`, entry-point
    group ``plait.checkpoint_formats``). Every strategy reads a checkpoint of a format
    its checkpoint IO does not write through it: whole, in one process, without a
    process group, for the strategy to restore (and shard) as its own.
    """

    @property
    def name(self) -> str:
        """The registered name: ``"file"``, ``"distributed"``, ``"deepspeed"``, yours."""
        ...

    def recognizes(self, path: PathLike) -> bool:
        """Whether ``path`` holds a complete checkpoint of this format.

        It looks at files only (names, a few leading bytes), imports nothing heavy,
        and raises nothing: a path it cannot look at is not its format.
        """
        ...

    def read_whole(self, path: PathLike, *, optimizers: bool = True) -> Checkpoint:
        """The whole checkpoint at ``path``, its tensors on the CPU, in one process.

        In the layout every strategy restores: the module's state under
        ``"state_dict"`` (the user module's keys), the optimizers' under
        ``"optimizer_states"`` (unless ``optimizers`` is false) and the run's other
        entries as they were saved.

        Raises:
            CheckpointError: It is incomplete or cannot be read.
        """
        ...

    def consolidate(self, path: PathLike, output: PathLike, *, weights_only: bool = False) -> None:
        """Write the checkpoint at ``path`` as one ``torch.save`` file at ``output``.

        The file holds ``{"state_dict": ...}`` with the user module's keys, and,
        unless ``weights_only``, the optimizers' states and the run's entries too.

        Raises:
            CheckpointError: It cannot be read, or ``output`` cannot be written.
        """
        ...


@runtime_checkable
class SupportsFormat(Protocol):
    """A checkpoint IO that says which registered format it writes (and reads natively).

    A strategy reads a checkpoint of another format whole, through that format;
    one of its IO's own format, through the IO.
    """

    @property
    def format(self) -> str:
        """The registered name of the format it writes."""
        ...
