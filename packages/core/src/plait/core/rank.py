"""Rank-aware helpers: run or log something on global rank zero only.

The rank is read when it is needed, never cached: from the initialised default process
group if there is one, otherwise from the variables the launchers set (``RANK`` first,
as torchrun and plait's own launchers do), otherwise 0.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Final, ParamSpec, TypeVar, overload

from plait.core.errors import ConfigurationError

__all__ = [
    "RANK_ENV_VARS",
    "get_global_rank",
    "publish_rank",
    "rank_zero_debug",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
]

P = ParamSpec("P")
R = TypeVar("R")

log: Final = logging.getLogger("plait")

RANK_ENV_VARS: Final = (
    "RANK",  # torchrun, plait's launchers
    "SLURM_PROCID",  # SLURM
    "OMPI_COMM_WORLD_RANK",  # Open MPI
    "PMI_RANK",  # MPICH, Intel MPI
    "JSM_NAMESPACE_RANK",  # LSF
)
"""The variables that give a process's global rank, in the order they are read."""


def get_global_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's global rank.

    Args:
        environ: The variables to read instead of `os.environ`.

    Raises:
        ConfigurationError: A rank variable is set but is not a non-negative integer.
    """
    # Looked up, not imported: if torch.distributed was never imported, no process
    # group can exist, and plait.core stays free of torch at import.
    dist = sys.modules.get("torch.distributed")
    if environ is None and dist is not None and dist.is_available() and dist.is_initialized():
        rank: int = dist.get_rank()
        return rank
    environ = os.environ if environ is None else environ
    for variable in RANK_ENV_VARS:
        value = environ.get(variable)
        if value is None:
            continue
        try:
            rank = int(value)
        except ValueError:
            rank = -1
        if rank < 0:
            raise ConfigurationError(
                f"the environment variable {variable}={value!r} is not a rank",
                value=value,
                fix=f"set {variable} to this process's global rank (0, 1, ...) or unset it",
            )
        return rank
    return 0


_RANK_ZERO_SWITCHES: Final = ("lightning_utilities.core.rank_zero",)
"""Modules whose ``rank_zero_only`` keeps a rank of its own (``rank_zero_only.rank``).

lightning_utilities' raises ``The `rank_zero_only.rank` needs to be set before use``
until someone sets it; torchmetrics, and many projects' loggers, call it.
"""


def publish_rank(rank: int | None = None) -> None:
    """Give ``rank`` to the libraries that keep a rank-zero switch of their own.

    lightning_utilities' ``rank_zero_only`` (which torchmetrics and projects written
    for Lightning call) reads ``rank_zero_only.rank``, which Lightning sets and plait
    sets here: where the module is loaded, never importing it. plait calls it when
    ``plait.trainer`` is imported, when a Trainer is made, and when a strategy sets
    up its process (with the rank it runs as).

    Args:
        rank: This process's global rank; by default `get_global_rank`'s.
    """
    for name in _RANK_ZERO_SWITCHES:
        module = sys.modules.get(name)
        switch = getattr(module, "rank_zero_only", None)
        if switch is not None:
            switch.rank = get_global_rank() if rank is None else rank


@overload
def rank_zero_only(function: Callable[P, R]) -> Callable[P, R | None]: ...


@overload
def rank_zero_only(function: Callable[P, R], *, default: R) -> Callable[P, R]: ...


def rank_zero_only(function: Callable[P, R], *, default: R | None = None) -> Callable[P, R | None]:
    """Wrap ``function`` so that it runs on global rank zero and returns ``default`` elsewhere.

    Example:
        >>> @rank_zero_only
        ... def report(message: str) -> None:
        ...     print(message)
    """

    @functools.wraps(function)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R | None:
        if get_global_rank() == 0:
            return function(*args, **kwargs)
        return default

    return wrapped


def rank_zero_info(message: str, *args: object) -> None:
    """Log ``message % args`` at INFO on the ``plait`` logger, on rank zero only."""
    if get_global_rank() == 0:
        log.info(message, *args)


def rank_zero_debug(message: str, *args: object) -> None:
    """Log ``message % args`` at DEBUG on the ``plait`` logger, on rank zero only."""
    if get_global_rank() == 0:
        log.debug(message, *args)


def rank_zero_warn(
    message: str, category: type[Warning] = UserWarning, *, stacklevel: int = 1
) -> None:
    """Issue ``warnings.warn(message, category)`` on rank zero only.

    ``stacklevel`` means what it means to ``warnings.warn``, counted from the caller:
    1 points at the line that calls this function, 2 at its caller, and so on.
    """
    if get_global_rank() == 0:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
