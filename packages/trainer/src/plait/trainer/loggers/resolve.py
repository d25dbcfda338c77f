"""The Trainer's ``logger=`` as a list of loggers, each recognised without running it."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TypeGuard, cast

from typing_extensions import get_protocol_members

from plait.core import ConfigurationError
from plait.trainer.loggers.base import Logger
from plait.trainer.loggers.csv_logger import CSVLogger

__all__ = ["is_logger", "resolve_loggers"]


def is_logger(candidate: object) -> TypeGuard[Logger]:
    """Whether ``candidate`` has what a `Logger` has, read without running its properties.

    ``isinstance(candidate, Logger)`` runs ``log_dir`` on Python 3.11, which an MLflow
    logger answers by reaching its store: checked so, a logger made on every rank would
    connect from every rank, before the run.
    """
    return all(
        inspect.getattr_static(candidate, name, None) is not None
        for name in get_protocol_members(Logger)
    )


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
    single = is_logger(given)
    if not (single or isinstance(given, Sequence)) or isinstance(given, str):
        raise ConfigurationError(
            f"logger={logger!r} is neither True, False, a Logger nor a list of them",
            value=logger,
            fix="pass True (a CSVLogger), False, CSVLogger(...), TensorBoardLogger(...), "
            "MLFlowLogger(...), or a list of them",
        )
    items: Sequence[object] = [given] if single else cast("Sequence[object]", given)
    listed: list[Logger] = []
    for item in items:
        if not is_logger(item):
            raise ConfigurationError(
                f"logger={item!r} is a {type(item).__name__}, not a Logger",
                value=item,
                fix="pass True, False, CSVLogger(...), TensorBoardLogger(...), "
                "MLFlowLogger(...) or an object implementing plait.trainer.Logger",
            )
        listed.append(item)
    return listed
