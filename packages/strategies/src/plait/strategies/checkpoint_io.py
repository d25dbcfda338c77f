"""A base class for checkpoint IOs of your own: say how to save and load, the rest is given."""

from __future__ import annotations

import abc
import os
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING

from plait.core import CheckpointError

if TYPE_CHECKING:
    import torch

    from plait.core.typing import Checkpoint, PathLike

__all__ = ["CheckpointIO"]


class CheckpointIO(abc.ABC):
    """Subclass it to write and read checkpoints your way; it meets `plait.core.CheckpointIO`.

    Only `save_checkpoint` and `load_checkpoint` are yours to write. `remove_checkpoint`
    removes local files and directories (override it for remote storage), and
    `teardown` has nothing to release. A `load_checkpoint` that takes no
    ``map_location`` is called without one.

    Example::

        class InMemoryIO(CheckpointIO):
            def __init__(self):
                self.files = {}

            def save_checkpoint(self, checkpoint, path):
                self.files[str(path)] = dict(checkpoint)

            def load_checkpoint(self, path, map_location=None):
                return self.files[str(path)]
    """

    @abc.abstractmethod
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Write ``checkpoint`` to ``path``, replacing what is there."""

    @abc.abstractmethod
    def load_checkpoint(
        self, path: PathLike, map_location: torch.device | str | None = None
    ) -> Checkpoint:
        """Read the checkpoint at ``path`` (tensors on ``map_location``)."""

    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete the local file or directory at ``path``.

        Raises:
            CheckpointError: It does not exist, is not local (override this method for
                remote storage), or cannot be removed.
        """
        where = os.fspath(path)
        if "://" in where:
            raise CheckpointError(
                where,
                f"cannot be removed: {type(self).__qualname__} removes local paths only",
                fix=f"override {type(self).__qualname__}.remove_checkpoint for this storage",
            )
        try:
            if os.path.isdir(where):
                shutil.rmtree(where)
            else:
                os.remove(where)
        except FileNotFoundError:
            raise CheckpointError(where, "cannot be removed: it does not exist") from None
        except OSError as error:
            raise CheckpointError(where, f"cannot be removed: {error}") from error

    def teardown(self) -> None:  # noqa: B027 (a default to extend)
        """Nothing to release by default."""
