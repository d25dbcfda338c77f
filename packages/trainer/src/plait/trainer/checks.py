"""Checks of settings as users give them (any object), with errors that say what to write."""

from __future__ import annotations

import math
from datetime import timedelta

from plait.core import ConfigurationError

__all__ = ["check_count", "check_number", "check_timeout"]


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
