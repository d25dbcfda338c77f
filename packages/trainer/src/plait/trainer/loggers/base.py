"""What a logger is (`Logger`), and the versioned directory the file loggers write in."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from typing_extensions import override

from plait.core import ConfigurationError

if TYPE_CHECKING:
    import torch

    from plait.trainer.metrics import Number

__all__ = [
    "Logger",
    "SupportsConnect",
    "SupportsLogGraph",
    "VersionedDirectory",
    "check_prefix",
    "experiment_path",
    "flatten_params",
    "next_version",
]

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


@runtime_checkable
class SupportsLogGraph(Protocol):
    """A logger that can record the module's computational graph when a run starts."""

    def log_graph(self, module: torch.nn.Module) -> None:
        """Record ``module``'s graph (on global rank 0, once the module is set up)."""
        ...


def experiment_path(name: str | None) -> str:
    """``name`` as a relative directory (``""``: none), as the file loggers take it.

    ``None`` and ``""`` put the versions straight under ``save_dir``; ``"csv/"`` and
    ``"runs/a"`` are directories under it.

    Raises:
        ConfigurationError: It is not a string, is absolute, or leaves ``save_dir``.
    """
    given: object = name  # checked as given
    if given is None or given == "":
        return ""
    if not isinstance(given, str):
        raise ConfigurationError(
            f"name={given!r} must be a directory name (a string) or None",
            value=given,
            fix="pass e.g. name='plait_logs', or None to write under save_dir itself",
        )
    folder = os.path.normpath(given)
    if os.path.isabs(folder) or folder == os.pardir or folder.startswith(os.pardir + os.sep):
        raise ConfigurationError(
            f"name={given!r} leaves save_dir: it names the experiment's directory under it",
            value=given,
            fix="pass a relative name (name='csv'), and the root as save_dir",
        )
    return "" if folder == os.curdir else folder


def flatten_params(params: Mapping[str, object], prefix: str = "") -> Iterator[tuple[str, object]]:
    """Nested settings as ``a/b`` names and their values (an empty mapping is a value)."""
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flatten_params(value, f"{name}/")
        else:
            yield name, value


def check_prefix(prefix: object) -> str:
    """``prefix`` (put before every metric name, joined with ``-``), checked.

    Raises:
        ConfigurationError: It is not a string.
    """
    if not isinstance(prefix, str):
        raise ConfigurationError(
            f"prefix={prefix!r} must be a string", value=prefix, fix="pass e.g. prefix='fold1'"
        )
    return prefix


class VersionedDirectory:
    """A run's directory, ``save_dir/name/version_N``: what the file loggers write in."""

    def __init__(
        self, save_dir: str | os.PathLike[str], name: str | None, version: int | str | None
    ) -> None:
        self.save_dir = os.fspath(save_dir)
        self.name = experiment_path(name)
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
