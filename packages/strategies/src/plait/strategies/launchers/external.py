"""The launcher for processes that something else started (torchrun, a scheduler)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from typing_extensions import override

__all__ = ["ExternalLauncher"]

P = ParamSpec("P")
R = TypeVar("R")


class ExternalLauncher:
    """Runs the function in this process only: the scheduler started every rank."""

    @property
    def is_interactive_compatible(self) -> bool:
        """Always: nothing is started."""
        return True

    def launch(self, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``function(*args, **kwargs)`` here and return its result."""
        return function(*args, **kwargs)

    @override
    def __repr__(self) -> str:
        return "ExternalLauncher()"
