"""Loggers: where logged metrics go. A CSV file, TensorBoard, or yours (the `Logger` protocol)."""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from typing_extensions import override

from plait.core import ConfigurationError, MissingDependencyError, is_module_available

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from plait.trainer.metrics import Number

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger", "next_version", "resolve_loggers"]

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


def next_version(root: str) -> int:
    """The first ``N`` such that ``root/version_N`` does not exist yet."""
    if not os.path.isdir(root):
        return 0
    taken = [int(m.group(1)) for entry in os.listdir(root) if (m := _VERSION.fullmatch(entry))]
    return max(taken, default=-1) + 1


class _VersionedDirectory:
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


class CSVLogger(_VersionedDirectory):
    """Write metrics to ``<save_dir>/<name>/version_N/metrics.csv``, a row per step.

    A column appears for each metric name; a row holds the values logged at one
    step (epoch values at the step where the epoch ended). Settings go to
    ``hparams.json`` beside it.

    Args:
        save_dir: The root directory.
        name: The experiment's directory under it.
        version: The run's version; the next free number by default.
    """

    FILE_NAME = "metrics.csv"

    def __init__(
        self,
        save_dir: str | os.PathLike[str] = ".",
        name: str = "plait_logs",
        version: int | str | None = None,
    ) -> None:
        super().__init__(save_dir, name, version)
        self._columns: list[str] = ["step"]
        self._rows: list[dict[str, object]] = []

    @property
    def path(self) -> str:
        """The CSV file."""
        return os.path.join(self.log_dir, self.FILE_NAME)

    def log_metrics(self, metrics: Mapping[str, Number], step: int) -> None:
        """Add a row (rewriting the file when a new metric adds a column)."""
        row: dict[str, object] = {"step": step, **metrics}
        self._rows.append(row)
        new = [name for name in metrics if name not in self._columns]
        os.makedirs(self.log_dir, exist_ok=True)
        if new or len(self._rows) == 1:
            self._columns.extend(new)
            with open(self.path, "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=self._columns)
                writer.writeheader()
                writer.writerows(self._rows)
            return
        with open(self.path, "a", newline="") as file:
            csv.DictWriter(file, fieldnames=self._columns).writerow(row)

    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        """Write ``hparams.json`` (values that JSON cannot hold are written as text)."""
        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.log_dir, "hparams.json"), "w") as file:
            json.dump(dict(params), file, indent=2, default=repr)

    def finalize(self, status: str) -> None:
        """Nothing to close: every row is written as it comes."""

    @override
    def __repr__(self) -> str:
        return f"CSVLogger(save_dir={self.save_dir!r}, name={self.name!r})"


class TensorBoardLogger(_VersionedDirectory):
    """Write metrics as TensorBoard scalars under ``<save_dir>/<name>/version_N``.

    Needs the ``tensorboard`` package (``pip install 'plait-trainer[tensorboard]'``).

    Args:
        save_dir: The root directory (``tensorboard --logdir <save_dir>`` shows it).
        name: The experiment's directory under it.
        version: The run's version; the next free number by default.

    Raises:
        MissingDependencyError: tensorboard is not installed.
    """

    def __init__(
        self,
        save_dir: str | os.PathLike[str] = ".",
        name: str = "plait_logs",
        version: int | str | None = None,
    ) -> None:
        if not is_module_available("tensorboard"):
            raise MissingDependencyError(
                feature="TensorBoardLogger",
                install="plait-trainer[tensorboard]",
                module="tensorboard",
            )
        super().__init__(save_dir, name, version)
        self._writer: SummaryWriter | None = None

    @override
    def __getstate__(self) -> dict[str, object]:
        # An open event file does not travel: each process opens its own on first use.
        return {**self.__dict__, "_writer": None}

    @property
    def writer(self) -> SummaryWriter:
        """The open event writer."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 (optional, slow)

            self._writer = SummaryWriter(log_dir=self.log_dir)
        return self._writer

    def log_metrics(self, metrics: Mapping[str, Number], step: int) -> None:
        """Add each metric as a scalar at ``step``."""
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        """Add the settings as a text summary."""
        self.writer.add_text("hparams", json.dumps(dict(params), indent=2, default=repr))

    def finalize(self, status: str) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    @override
    def __repr__(self) -> str:
        return f"TensorBoardLogger(save_dir={self.save_dir!r}, name={self.name!r})"


def resolve_loggers(logger: bool | Logger | Sequence[Logger], root: str) -> list[Logger]:
    """The Trainer's ``logger=`` as a list: ``True`` is a `CSVLogger` in ``root``.

    Raises:
        ConfigurationError: It is none of ``True``, ``False``, a `Logger` or a list of them.
    """
    if logger is True:
        return [CSVLogger(root)]
    if logger is False:
        return []
    given: object = logger  # checked as given: users pass anything
    if not isinstance(given, Logger | Sequence) or isinstance(given, str):
        raise ConfigurationError(
            f"logger={logger!r} is neither True, False, a Logger nor a list of them",
            value=logger,
            fix="pass True (a CSVLogger), False, CSVLogger(...), TensorBoardLogger(...), "
            "or a list of them",
        )
    listed = [logger] if isinstance(logger, Logger) else list(logger)
    for item in listed:
        if not isinstance(item, Logger):
            raise ConfigurationError(
                f"logger={item!r} is a {type(item).__name__}, not a Logger",
                value=item,
                fix="pass True, False, CSVLogger(...), TensorBoardLogger(...) or an "
                "object implementing plait.trainer.Logger",
            )
    return listed
