"""Checks of settings as users give them (any object), with errors that say what to write."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.core.typing import PathLike

__all__ = [
    "check_count",
    "check_number",
    "check_root",
    "check_timeout",
    "compile_options",
]


def check_count(name: str, value: object, *, minimum: int, example: str) -> int:
    """``value`` as an int of at least ``minimum`` (a bool is not a count).

    Raises:
        ConfigurationError: It is not one; the message names it and shows ``example``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(
            f"{name}={value!r} must be an int of at least {minimum}",
            value=value,
            fix=f"pass e.g. {example}",
        )
    return value


def check_number(name: str, value: object, *, positive: bool, example: str) -> float:
    """``value`` as a finite float, above 0 when ``positive``, else at least 0.

    Raises:
        ConfigurationError: It is not one.
    """
    bad = isinstance(value, bool) or not isinstance(value, int | float)
    if not bad:
        assert isinstance(value, int | float)
        bad = not math.isfinite(value) or value < 0 or (positive and value == 0)
    if bad:
        least = "above 0" if positive else "at least 0"
        raise ConfigurationError(
            f"{name}={value!r} must be a finite number {least}",
            value=value,
            fix=f"pass e.g. {example}",
        )
    return float(value)  # type: ignore[arg-type]


def check_timeout(name: str, value: object) -> timedelta:
    """``value`` (seconds, or a `timedelta`) as a positive `timedelta`.

    Raises:
        ConfigurationError: It is neither, or not above 0.
    """
    if not isinstance(value, timedelta):
        return timedelta(seconds=check_number(name, value, positive=True, example=f"{name}=600"))
    if value <= timedelta(0):
        raise ConfigurationError(
            f"{name}={value!r} must be positive", value=value, fix=f"pass e.g. {name}=600"
        )
    return value


_COMPILE_OPTIONS: Final = ("fullgraph", "dynamic", "backend", "mode", "options", "disable")


def compile_options(value: object) -> dict[str, object] | None:
    """``torch.compile``'s keyword arguments, from ``True``, ``False`` or a mapping of them.

    Raises:
        ConfigurationError: Neither a bool nor a mapping of ``torch.compile``'s options.
    """
    if value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        unknown = sorted(set(value) - set(_COMPILE_OPTIONS))
        if unknown:
            raise ConfigurationError.invalid_choice("compile option", unknown[0], _COMPILE_OPTIONS)
        return dict(value)
    raise ConfigurationError(
        f"compile={value!r} is neither a bool nor a dict of torch.compile's options",
        value=value,
        fix="pass compile=True, or e.g. compile={'mode': 'max-autotune'}",
    )


def check_root(root: PathLike | None, *, writes: bool) -> str:
    """The root directory as a string; when ``writes``, made and found writable now."""
    path = os.fspath(root) if root else os.getcwd()
    if not writes or "://" in path:
        return path  # a URL: its filesystem says what is allowed when it is written
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise ConfigurationError(
            f"default_root_dir={path!r} cannot hold logs and checkpoints: "
            f"{error.strerror or error}",
            value=path,
            fix="pass a directory you can write to, e.g. default_root_dir='runs'",
        ) from None
    return path
