"""Importing optional heavy backends lazily, with an error that says what to install."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from plait.core.errors import MissingDependencyError

__all__ = ["is_module_available", "require_module"]


def is_module_available(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        # find_spec imports parent packages, which can be missing or broken.
        return False


def require_module(module: str, *, feature: str, install: str) -> ModuleType:
    """Import ``module``, or explain which extra to install to get it.

    Call it where the backend is first needed, never at module import, so that plait
    imports fast and works without the backend.

    Args:
        module: The module to import, e.g. ``"deepspeed"``.
        feature: What needs it, for the message, e.g. ``"the 'deepspeed' strategy"``.
        install: What to install, e.g. ``"plait-strategies[deepspeed]"``.

    Raises:
        MissingDependencyError: ``module`` (or a module it needs) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        raise MissingDependencyError(feature=feature, install=install, module=module) from error
