"""Parsing device specs as users write them.

The forms: a count (``2`` or ``"2"``), device indices (``[0, 2]``, ``"0,2"``, or
``"1,"`` for the single device 1), every device (``-1``) and ``"auto"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from plait.core import ConfigurationError

__all__ = ["parse_device_spec"]

_FORMS: Final = "an int (2), its string ('2'), a list of indices ([0, 2] or '0,2'), -1 or 'auto'"


def parse_device_spec(
    spec: object, *, accelerator: str, available: int | None, auto: int
) -> tuple[int, ...]:
    """Turn a device spec into the indices of the devices to use.

    Args:
        spec: What the user wrote.
        accelerator: The accelerator's name, for messages.
        available: How many devices exist; ``None`` when the devices are processes
            that can be started at will (the CPU), which also have no indices to pick.
        auto: How many devices ``"auto"`` means.

    Returns:
        Device indices: ``(0, 1)`` for ``2``, ``(0, 2)`` for ``[0, 2]``.

    Raises:
        ConfigurationError: The spec is of the wrong type, asks for no device, for
            more devices than exist, for an index twice or for one that does not
            exist; the message says what was asked, what exists and what to write.
    """
    if isinstance(spec, str):
        return _parse_string(spec, accelerator=accelerator, available=available, auto=auto)
    if isinstance(spec, bool) or not isinstance(spec, int | Sequence):
        raise ConfigurationError(
            f"devices={spec!r} is a {type(spec).__name__}, which is not a device spec",
            value=spec,
            fix=f"write devices as {_FORMS}",
        )
    if isinstance(spec, int):
        return _count(spec, accelerator=accelerator, available=available)
    return _indices(spec, accelerator=accelerator, available=available)


def _exists(accelerator: str, available: int | None) -> str:
    if available is None:
        return f"{accelerator} devices are processes: devices=N starts N of them"
    if available == 0:
        return f"this machine has no {accelerator} device"
    indices = ", ".join(str(index) for index in range(available))
    return f"this machine has {available} {accelerator} device(s) (indices {indices})"


def _parse_string(
    spec: str, *, accelerator: str, available: int | None, auto: int
) -> tuple[int, ...]:
    text = spec.strip().lower()
    if text == "auto":
        return tuple(range(auto))
    if "," in text:
        parts = [part.strip() for part in text.split(",")]
        if parts[-1] == "":  # "1," names the single device 1
            parts.pop()
        if all(part.isdigit() for part in parts) and parts:
            return _indices(
                [int(part) for part in parts], accelerator=accelerator, available=available
            )
    else:
        try:
            count = int(text)
        except ValueError:
            pass
        else:
            return _count(count, accelerator=accelerator, available=available)
    raise ConfigurationError(
        f"devices={spec!r} is not a device spec",
        value=spec,
        fix=f"write devices as {_FORMS}",
    )


def _count(count: int, *, accelerator: str, available: int | None) -> tuple[int, ...]:
    if count == -1:
        if available is None:
            raise ConfigurationError(
                f"devices=-1 means every device, which has no meaning for {accelerator}: "
                f"{_exists(accelerator, available)}",
                value=count,
                fix="write the number of processes, e.g. devices=2",
            )
        if available == 0:
            raise ConfigurationError(
                f"devices=-1 asks for every {accelerator} device, but "
                f"{_exists(accelerator, available)}",
                value=count,
                fix="use another accelerator, e.g. accelerator='cpu'",
            )
        return tuple(range(available))
    if count < 1:
        raise ConfigurationError(
            f"devices={count} asks for no device: a count must be at least 1 "
            "(or -1 for every device)",
            value=count,
            fix="write devices=1 or more",
        )
    if available is not None and count > available:
        raise ConfigurationError(
            f"devices={count} asks for {count} {accelerator} devices, but "
            f"{_exists(accelerator, available)}",
            value=count,
            fix=f"write devices={available}, or devices=-1 for all of them"
            if available
            else "use another accelerator, e.g. accelerator='cpu'",
        )
    return tuple(range(count))


def _indices(
    indices: Sequence[object], *, accelerator: str, available: int | None
) -> tuple[int, ...]:
    spec = list(indices)
    if available is None:
        raise ConfigurationError(
            f"devices={spec!r} picks device indices, but {_exists(accelerator, available)}",
            value=spec,
            fix=f"write the number of processes, e.g. devices={max(len(spec), 1)}",
        )
    if not spec:
        raise ConfigurationError(
            "devices=[] asks for no device",
            value=spec,
            fix="list at least one index, e.g. devices=[0]",
        )
    bad = [index for index in spec if isinstance(index, bool) or not isinstance(index, int)]
    if bad:
        raise ConfigurationError(
            f"devices={spec!r} holds {bad!r}, which are not device indices",
            value=spec,
            fix="list device indices as ints, e.g. devices=[0, 1]",
        )
    chosen = [index for index in spec if isinstance(index, int)]
    duplicates = sorted({index for index in chosen if chosen.count(index) > 1})
    if duplicates:
        raise ConfigurationError(
            f"devices={spec!r} names device(s) {duplicates} more than once",
            value=spec,
            fix=f"list each device once: devices={sorted(set(chosen))}",
        )
    missing = [index for index in chosen if not 0 <= index < available]
    if missing:
        raise ConfigurationError(
            f"devices={spec!r} names {accelerator} device(s) {missing} that do not exist: "
            f"{_exists(accelerator, available)}",
            value=spec,
            fix=f"pick indices from 0 to {available - 1}"
            if available
            else "use another accelerator, e.g. accelerator='cpu'",
        )
    return tuple(chosen)
