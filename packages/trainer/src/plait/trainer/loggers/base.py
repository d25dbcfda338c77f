"""What a logger is (`Logger`), and the versioned directory the file loggers write in."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from typing_extensions import override

from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.trainer.metrics import Number

__all__ = ["Logger", "SupportsConnect", "VersionedDirectory", "next_version"]

_VERSION = re.compile(r"version_(\d+)")


@runtime_checkable
class Logger(Protocol):
    """Receives the metrics of a run; the trainer calls it on global rank 0 only."""

    @property
    def log_dir(self) -> str:
        """The directory this run's records go to."""
        ...

    def log_metrics(self, metrics: Mapping[str, Number], step: int) -> None:
        """Record ``metrics`` at the optimizer step ``step``."""
        ...

    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        """Record the run's settings."""
        ...

    def finalize(self, status: str) -> None:
        """Flush and close; ``status`` is ``"success"`` or ``"failed"``."""
        ...


@runtime_checkable
class SupportsConnect(Protocol):
    """A logger that reaches a service: the trainer connects it when a run starts."""

    def connect(self) -> None:
        """Reach the service (on global rank 0, before training); raise if it cannot be."""
        ...


def next_version(root: str) -> int:
    """The first ``N`` such that ``root/version_N`` does not exist yet."""
    if not os.path.isdir(root):
        return 0
    taken = [int(m.group(1)) for entry in os.listdir(root) if (m := _VERSION.fullmatch(entry))]
    return max(taken, default=-1) + 1


class VersionedDirectory:
    """A run's directory, ``save_dir/name/version_N``: what the file loggers write in."""

    def __init__(
        self, save_dir: str | os.PathLike[str], name: str, version: int | str | None
    ) -> None:
        given: object = name  # checked as given
        if not isinstance(given, str) or not given or os.sep in given:
            raise ConfigurationError(
                f"name={name!r} must be a non-empty directory name",
                value=name,
                fix="pass e.g. name='plait_logs'",
            )
        self.save_dir = os.fspath(save_dir)
        self.name = name
        self._version = version

    @override
    def __getstate__(self) -> dict[str, object]:
        # Sent to spawned ranks: the version is settled here first, so that the
        # logger the caller holds names the directory rank 0 writes.
        _ = self.version
        return dict(self.__dict__)

    @property
    def version(self) -> int | str:
        """The run's version: the next free ``version_N`` unless one was given."""
        if self._version is None:
            self._version = next_version(os.path.join(self.save_dir, self.name))
        return self._version

    @property
    def log_dir(self) -> str:
        """``save_dir/name/version_N`` (or ``.../<version>`` for a string version)."""
        version = self.version
        folder = f"version_{version}" if isinstance(version, int) else version
        return os.path.join(self.save_dir, self.name, folder)
