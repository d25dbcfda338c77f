"""The names users give precision formats, and their aliases."""

from __future__ import annotations

from typing import Final

from plait.core import ConfigurationError

__all__ = ["ALIASES", "PRECISIONS", "parse_precision"]

PRECISIONS: Final = ("32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
"""Every format, by its full name."""

ALIASES: Final = {"32": "32-true", "64": "64-true", "16": "16-mixed", "bf16": "bf16-mixed"}
"""Short names and what they mean (as ``precision=16`` means mixed float16)."""


def parse_precision(value: object) -> str:
    """The full name of a precision as users write it: ``16``, ``"bf16"``, ``"32-true"``.

    Raises:
        ConfigurationError: It names no format; the message lists them.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str):
        key = value.strip().lower()
        if key in PRECISIONS:
            return key
        if key in ALIASES:
            return ALIASES[key]
    raise ConfigurationError.invalid_choice("precision", value, [*PRECISIONS, *ALIASES])
