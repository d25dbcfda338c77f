"""`CSVLogger`: a CSV file of metrics, a row per step."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from typing_extensions import override

from plait.core import rank_zero_only
from plait.trainer.loggers.base import VersionedDirectory, check_prefix

if TYPE_CHECKING:
    from plait.trainer.metrics import Number

__all__ = ["CSVLogger"]


class CSVLogger(VersionedDirectory):
    """Write metrics to ``<save_dir>/<name>/version_N/metrics.csv``, a row per step.

    A column appears for each metric name; a row holds the values logged at one
    step (epoch values at the step where the epoch ended). Settings go to
    ``hparams.json`` beside it. It writes on global rank 0 alone, as Lightning's
    does: a call on another rank (a project's code logging its settings on every
    rank) does nothing, and makes no version of its own.

    A file already there is continued, never replaced: a ``test`` after a ``fit``
    adds its rows below the fit's, also where the rows are written by another
    process's copy of the logger than the fit's (spawned ranks, a relaunched rank 0).

    Args:
        save_dir: The root directory.
        name: The experiment's directory under it (``None``: the versions go
            straight under ``save_dir``; ``"runs/a"``: nested).
        version: The run's version; the next free number by default.
        prefix: Put before every metric name, joined with ``-`` (``prefix="fold1"``
            logs ``fold1-val_loss``).
    """

    FILE_NAME = "metrics.csv"

    def __init__(
        self,
        save_dir: str | os.PathLike[str] = ".",
        name: str | None = "plait_logs",
        version: int | str | None = None,
        *,
        prefix: str = "",
    ) -> None:
        super().__init__(save_dir, name, version)
        self.prefix = check_prefix(prefix)
        self._columns: list[str] = ["step"]
        self._rows: list[dict[str, object]] = []
        self._read = False

    @property
    def path(self) -> str:
        """The CSV file."""
        return os.path.join(self.log_dir, self.FILE_NAME)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Number], step: int) -> None:
        """Add a row (rewriting the file when a new metric adds a column)."""
        if not self._read:
            self._read_existing()
        if self.prefix:
            metrics = {f"{self.prefix}-{name}": value for name, value in metrics.items()}
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

    def _read_existing(self) -> None:
        """Take in the rows of a file this copy of the logger did not write."""
        self._read = True
        if self._rows or not os.path.isfile(self.path):
            return
        with open(self.path, newline="") as file:
            reader = csv.DictReader(file)
            rows: list[dict[str, object]] = [dict(row) for row in reader]
            columns = list(reader.fieldnames or ())
        self._columns = [*columns, *(name for name in self._columns if name not in columns)]
        self._rows = rows

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        """Write ``hparams.json`` (values that JSON cannot hold are written as text)."""
        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.log_dir, "hparams.json"), "w") as file:
            json.dump(dict(params), file, indent=2, default=repr)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Nothing to close: every row is written as it comes."""

    @override
    def __repr__(self) -> str:
        return f"CSVLogger(save_dir={self.save_dir!r}, name={self.name!r})"
