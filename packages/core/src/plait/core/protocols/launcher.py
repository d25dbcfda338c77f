"""The Launcher protocol: starting the processes of a job."""

from __future__ import annotations

from typing import TYPE_CHECKING, ParamSpec, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Launcher"]

P = ParamSpec("P")
R = TypeVar("R")


@runtime_checkable
class Launcher(Protocol):
    """Starts (or joins) the processes of a job and runs a function in each."""

    @property
    def is_interactive_compatible(self) -> bool:
        """Whether it works from a notebook or REPL (no re-run of ``__main__``)."""
        ...

    def launch(self, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``function(*args, **kwargs)`` on every rank and return rank 0's result.

        Raises:
            PeerFailedError: A process failed; the others were stopped, none is left.
        """
        ...
