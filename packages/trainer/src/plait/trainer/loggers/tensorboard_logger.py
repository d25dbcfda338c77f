"""`TensorBoardLogger`: TensorBoard scalars, behind the ``tensorboard`` extra."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from typing_extensions import override

from plait.core import MissingDependencyError, is_module_available
from plait.trainer.loggers.base import VersionedDirectory

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from plait.trainer.metrics import Number

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger(VersionedDirectory):
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
        return {**super().__getstate__(), "_writer": None}

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
