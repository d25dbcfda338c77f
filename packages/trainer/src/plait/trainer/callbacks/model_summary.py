"""`ModelSummary` and `RichModelSummary`: the module's layers and parameter counts at fit start."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
from typing_extensions import override

from plait.core import ConfigurationError, rank_zero_info
from plait.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    import torch
    from rich.console import Console

    from plait.trainer.module import Module
    from plait.trainer.trainer import Trainer

__all__ = ["LayerRow", "ModelSummary", "RichModelSummary", "Summary", "summarize"]

_UNITS = ("", "K", "M", "B", "T")


def readable(count: int) -> str:
    """``1.2 K``, ``3.4 M``: a parameter count as Lightning's summary writes it."""
    value = float(count)
    for unit in _UNITS:
        if abs(value) < 1000 or unit == _UNITS[-1]:
            return f"{int(value)}" if not unit else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")  # pragma: no cover


@attrs.frozen
class LayerRow:
    """One submodule of the summary: its name, class, parameters and mode."""

    name: str
    kind: str
    parameters: int
    training: bool


@attrs.frozen
class Summary:
    """A module's layers to a depth, and its parameter counts."""

    rows: tuple[LayerRow, ...]
    trainable: int
    frozen: int
    size_mb: float
    in_train_mode: int
    in_eval_mode: int

    @property
    def total(self) -> int:
        """Every parameter, trainable or not."""
        return self.trainable + self.frozen


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def summarize(module: torch.nn.Module, max_depth: int = 1) -> Summary:
    """The summary of ``module``: its submodules down to ``max_depth`` (-1: all)."""
    rows = []
    for name, child in module.named_modules():
        if not name:
            continue
        depth = name.count(".") + 1
        if max_depth != -1 and depth > max_depth:
            continue
        rows.append(LayerRow(name, type(child).__name__, _count(child), child.training))
    parameters = list(module.parameters())
    trainable = sum(p.numel() for p in parameters if p.requires_grad)
    frozen = sum(p.numel() for p in parameters if not p.requires_grad)
    size = sum(p.numel() * p.element_size() for p in parameters) / 1e6
    modes = [m.training for m in module.modules()]
    return Summary(tuple(rows), trainable, frozen, size, sum(modes), len(modes) - sum(modes))


class ModelSummary(Callback):
    """Say, at the start of a fit on rank 0, the module's layers and parameter counts.

    A table of the submodules down to ``max_depth`` (name, class, parameters, train
    or eval mode), then the trainable, non-trainable and total parameters and their
    size in MB, as Lightning's callback of the same name prints it.

    Args:
        max_depth: How deep to list submodules: 1 the direct children, -1 all,
            0 only the totals.

    Raises:
        ConfigurationError: ``max_depth`` is not an int of -1 or more.
    """

    def __init__(self, max_depth: int = 1) -> None:
        given: object = max_depth  # checked as given
        if isinstance(given, bool) or not isinstance(given, int) or given < -1:
            raise ConfigurationError(
                f"max_depth={max_depth!r} must be an int of -1 or more",
                value=max_depth,
                fix="pass max_depth=1 (the direct children), -1 (all) or 0 (totals only)",
            )
        self.max_depth = max_depth

    @override
    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        if trainer.is_global_zero:
            self.show(summarize(module, self.max_depth))

    def show(self, summary: Summary) -> None:
        """Say ``summary`` (through the ``plait`` logger, at INFO)."""
        rank_zero_info("\n" + render(summary))


_HEADER: Final = ("", "Name", "Type", "Params", "Mode")


def _cells(summary: Summary) -> list[tuple[str, ...]]:
    """Each layer's row of the table, as text, under `_HEADER`."""
    rows = enumerate(summary.rows)
    return [
        (str(i), row.name, row.kind, readable(row.parameters), "train" if row.training else "eval")
        for i, row in rows
    ]


def render(summary: Summary) -> str:
    """The summary as plain text: a table of the layers, then the totals."""
    lines: list[Sequence[str]] = [_HEADER, *_cells(summary)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(_HEADER))]
    text = []
    for number, line in enumerate(lines):
        cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        text.append(" | ".join(cells).rstrip())
        if number == 0:
            text.append("-" * (sum(widths) + 3 * (len(widths) - 1)))
    if not summary.rows:
        text = []
    text += [
        f"{readable(summary.trainable):<8} Trainable params",
        f"{readable(summary.frozen):<8} Non-trainable params",
        f"{readable(summary.total):<8} Total params",
        f"{summary.size_mb:<8.3f} Total estimated model params size (MB)",
        f"{summary.in_train_mode:<8} Modules in train mode",
        f"{summary.in_eval_mode:<8} Modules in eval mode",
    ]
    return "\n".join(text)


class RichModelSummary(ModelSummary):
    """`ModelSummary` drawn as a rich table on the console (stderr by default).

    Args:
        max_depth: As `ModelSummary`'s.
        console: Where to draw; a console on stderr by default.
    """

    def __init__(self, max_depth: int = 1, console: Console | None = None) -> None:
        super().__init__(max_depth)
        self._console = console

    @override
    def show(self, summary: Summary) -> None:
        # rich is imported when a summary is first drawn, not with plait.trainer.
        from rich.console import Console  # noqa: PLC0415
        from rich.table import Table  # noqa: PLC0415

        console = self._console if self._console is not None else Console(stderr=True)
        if summary.rows:
            table = Table(header_style="bold magenta")
            for column in _HEADER:
                table.add_column(column, justify="right" if column == "Params" else "left")
            for cells in _cells(summary):
                table.add_row(*cells)
            console.print(table)
        console.print(
            f"[bold]Trainable params[/]: {readable(summary.trainable)}\n"
            f"[bold]Non-trainable params[/]: {readable(summary.frozen)}\n"
            f"[bold]Total params[/]: {readable(summary.total)}\n"
            f"[bold]Total estimated model params size (MB)[/]: {summary.size_mb:.3f}\n"
            f"[bold]Modules in train mode[/]: {summary.in_train_mode}\n"
            f"[bold]Modules in eval mode[/]: {summary.in_eval_mode}"
        )
