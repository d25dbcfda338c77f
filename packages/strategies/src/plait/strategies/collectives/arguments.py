"""Checks of the arguments every collective shares: timeouts, sources and groups."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from plait.core import ConfigurationError, ReduceOp

__all__ = ["as_timeout", "check_group_name", "check_src"]


def as_timeout(timeout: timedelta | float | None, default: timedelta) -> timedelta:
    """A timeout as a `timedelta`: seconds, a `timedelta`, or ``None`` for ``default``.

    Raises:
        ValueError: It is not positive.
    """
    if timeout is None:
        return default
    value = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
    if value <= timedelta(0):
        raise ValueError(f"timeout={timeout!r} must be positive")
    return value


def check_src(src: object, ranks: Sequence[int]) -> int:
    """``src``, checked to be one of ``ranks`` (global ranks).

    Raises:
        ValueError: It is not.
    """
    if isinstance(src, bool) or not isinstance(src, int) or src not in ranks:
        where = (
            f"the ranks [0, {len(ranks)})"
            if list(ranks) == list(range(len(ranks)))
            else f"the group's ranks {list(ranks)}"
        )
        raise ValueError(
            f"broadcast src={src!r} is outside {where}: pass the global rank that holds the value"
        )
    return src


def check_group_name(group: str, dimensions: Sequence[str]) -> None:
    """Raise unless ``group`` names one of the layout's ``dimensions``.

    Raises:
        ConfigurationError: It does not; a reduction's name (``reduce(x, "sum")``,
            Lightning's order) says to pass it as ``reduce_op=``.
    """
    if group in dimensions:
        return
    try:
        ReduceOp.parse(group)
    except ConfigurationError:
        raise ConfigurationError.invalid_choice(
            "group",
            group,
            list(dimensions),
            fix="pass a process group, or the name of a dimension of the strategy's layout",
        ) from None
    raise ConfigurationError(
        f"group={group!r} names a reduction, not a group: the second argument of reduce "
        "is the group, as in reduce(tensor, group=None, reduce_op='mean')",
        value=group,
        fix=f"pass reduce_op={group!r}",
    )
