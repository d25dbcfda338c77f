"""`TensorBoardLogger`: TensorBoard scalars, behind the ``tensorboard`` extra."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

import torch
from typing_extensions import override

from plait.core import (
    ConfigurationError,
    MissingDependencyError,
    is_module_available,
    rank_zero_only,
    rank_zero_warn,
)
from plait.trainer.loggers.base import VersionedDirectory, check_prefix, flatten_params

if TYPE_CHECKING:
    from collections.abc import Iterator

    from torch.utils.tensorboard import SummaryWriter

    from plait.trainer.metrics import Number

__all__ = ["TensorBoardLogger"]


class _SummaryFile(Protocol):
    """The event file of a ``SummaryWriter``: where a summary protobuf is written."""

    def add_summary(self, summary: object) -> None: ...


class TensorBoardLogger(VersionedDirectory):
    """Write metrics as TensorBoard scalars under ``<save_dir>/<name>/version_N``.

    Needs the ``tensorboard`` package (``pip install 'plait-trainer[tensorboard]'``).
    It writes on global rank 0 alone, as Lightning's does: a call on another rank
    (a project's code logging its settings on every rank) does nothing.

    Args:
        save_dir: The root directory (``tensorboard --logdir <save_dir>`` shows it).
        name: The experiment's directory under it (``None``: the versions go
            straight under ``save_dir``; ``"runs/a"``: nested).
        version: The run's version; the next free number by default.
        log_graph: Add the module's graph when a run starts, traced from its
            ``example_input_array`` (where the strategy does not shard the module).
        default_hp_metric: With the hyperparameters, log ``hp_metric = -1`` (a
            placeholder TensorBoard's HPARAMS tab lists them by; log ``hp_metric``
            yourself to fill it).
        prefix: Put before every metric name, joined with ``-``.

    Raises:
        MissingDependencyError: tensorboard is not installed.
    """

    def __init__(
        self,
        save_dir: str | os.PathLike[str] = ".",
        name: str | None = "plait_logs",
        version: int | str | None = None,
        *,
        log_graph: bool = False,
        default_hp_metric: bool = True,
        prefix: str = "",
    ) -> None:
        if not is_module_available("tensorboard"):
            raise MissingDependencyError(
                feature="TensorBoardLogger",
                install="plait-trainer[tensorboard]",
                module="tensorboard",
            )
        super().__init__(save_dir, name, version)
        for argument, flag in (("log_graph", log_graph), ("default_hp_metric", default_hp_metric)):
            if not isinstance(flag, bool):
                raise ConfigurationError(
                    f"{argument}={flag!r} must be True or False",
                    value=flag,
                    fix=f"pass {argument}=True",
                )
        self.prefix = check_prefix(prefix)
        self._log_graph = log_graph
        self._default_hp_metric = default_hp_metric
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

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Number], step: int) -> None:
        """Add each metric as a scalar at ``step``."""
        prefix = f"{self.prefix}-" if self.prefix else ""
        for name, value in metrics.items():
            self.writer.add_scalar(prefix + name, value, global_step=step)

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        """Add the settings as a text summary and to the HPARAMS tab (with ``hp_metric``)."""
        from torch.utils.tensorboard.summary import hparams  # noqa: PLC0415 (optional, slow)

        writer = self.writer
        writer.add_text("hparams", json.dumps(dict(params), indent=2, default=repr))
        flat = dict(_holdable(params))
        metrics = {"hp_metric": -1.0} if self._default_hp_metric else {}
        experiment, start, end = hparams(flat, metrics)  # type: ignore[no-untyped-call]
        # Typed None in torch's stubs; an open writer holds its event file's writer.
        file_writer: _SummaryFile | None = getattr(writer, "file_writer", None)
        if file_writer is None:
            return
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)
        if self._default_hp_metric:
            writer.add_scalar("hp_metric", -1.0, global_step=0)

    @rank_zero_only
    def log_graph(self, module: torch.nn.Module) -> None:
        """Add ``module``'s graph, traced from its ``example_input_array`` (with ``log_graph``)."""
        if not self._log_graph:
            return
        example = getattr(module, "example_input_array", None)
        if example is None:
            rank_zero_warn(
                "TensorBoardLogger(log_graph=True) could not add the module's graph: "
                f"{type(module).__name__} has no example_input_array (set "
                "self.example_input_array = torch.rand(...) in __init__)"
            )
            return
        device = next(module.parameters(), torch.empty(0)).device
        inputs = example.to(device) if isinstance(example, torch.Tensor) else example
        with warnings.catch_warnings():
            # The writer traces with torch.jit.trace, which torch now warns of: the
            # graph is the writer's to draw, and it draws it.
            warnings.filterwarnings(
                "ignore", r"`torch\.jit\.trace(_method)?` is deprecated", DeprecationWarning
            )
            self.writer.add_graph(module, inputs)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    @override
    def __repr__(self) -> str:
        return f"TensorBoardLogger(save_dir={self.save_dir!r}, name={self.name!r})"


def _holdable(params: Mapping[str, object]) -> Iterator[tuple[str, object]]:
    """Nested settings as ``a/b`` names, each value one TensorBoard's HPARAMS tab holds."""
    for name, value in flatten_params(params):
        if isinstance(value, bool | int | float | str) or (
            isinstance(value, torch.Tensor) and value.numel() == 1
        ):
            yield name, value
        else:
            yield name, repr(value)
