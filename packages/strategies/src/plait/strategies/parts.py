"""A strategy's parts: given as objects, or made by name from the core registries."""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Final

import attrs

from plait.core import (
    Accelerator,
    AcceleratorRegistry,
    CheckpointIO,
    CheckpointIORegistry,
    ConfigurationError,
    EnvironmentRegistry,
    MissingDependencyError,
    Precision,
    PrecisionRegistry,
    as_accelerator,
)

__all__ = ["Parts", "one_precision", "require_parts", "resolve_parts"]


def _require(part: object, protocol: type, what: str) -> None:
    if not isinstance(part, protocol):
        raise ConfigurationError(
            f"{what}={part!r} is a {type(part).__name__}, which is not a {protocol.__name__}",
            value=part,
            fix=f"pass an object that implements plait.core.{protocol.__name__}, or a "
            f"registered name",
        )


def one_precision(
    precision: Precision | str | None, precision_plugin: Precision | str | None
) -> Precision | str | None:
    """The one precision of ``precision=`` and its other name ``precision_plugin=``.

    Raises:
        ConfigurationError: Both were given, as different values.
    """
    if precision_plugin is None:
        return precision
    if precision is not None and precision is not precision_plugin:
        raise ConfigurationError(
            f"two precisions were given: precision={precision!r} and "
            f"precision_plugin={precision_plugin!r}",
            value=precision_plugin,
            fix="pass one of them (precision_plugin= is the other name of precision=)",
        )
    return precision_plugin


_PART_DISTRIBUTIONS: Final[dict[str, str | None]] = {
    "accelerator": AcceleratorRegistry.distribution,
    "precision": PrecisionRegistry.distribution,
    "checkpoint_io": CheckpointIORegistry.distribution,
    "cluster_environment": EnvironmentRegistry.distribution,
}
"""The distribution each kind of part comes from, when it is given by name."""


@functools.cache
def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def require_parts(strategy: object, **parts: object) -> None:
    """Check at once that every part given by name (or left to its default) can be built.

    Parts come from their own distributions, found by name at run time: a strategy
    built where some are missing names all of them in one error, with the extra
    that brings them.

    Args:
        strategy: The strategy being made, for the message.
        **parts: ``accelerator``, ``precision``, ``checkpoint_io`` or
            ``cluster_environment``, as given (``None`` or a name means by name).

    Raises:
        MissingDependencyError: A distribution a named part comes from is not
            installed (every such one is named).
    """
    missing = []
    for part, value in parts.items():
        distribution = _PART_DISTRIBUTIONS[part]
        named = value is None or isinstance(value, str)
        if named and distribution is not None and not _installed(distribution):
            missing.append(distribution)
    everything = [
        distribution
        for distribution in _PART_DISTRIBUTIONS.values()
        if distribution is not None and not _installed(distribution)
    ]
    if missing:
        raise MissingDependencyError(
            feature=(
                f"{type(strategy).__name__}'s parts by name (from "
                f"{', '.join(dict.fromkeys([*missing, *everything]))})"
            ),
            install="plait-strategies[parts]",
        )


@attrs.frozen
class Parts:
    """The accelerator, precision and checkpoint IO a strategy is built from."""

    accelerator: Accelerator
    precision: Precision
    checkpoint_io: CheckpointIO


def resolve_parts(
    strategy: object,
    *,
    device_type: str,
    accelerator: Accelerator | str | None,
    precision: Precision | str | None,
    checkpoint_io: CheckpointIO | str | None,
) -> Parts:
    """Each part as given, or made by name: the device's accelerator, ``"32-true"``, ``"torch"``.

    Raises:
        MissingDependencyError: A part is named and its distribution is missing.
        ConfigurationError: A part is not an object of its Protocol.
    """
    require_parts(
        strategy, accelerator=accelerator, precision=precision, checkpoint_io=checkpoint_io
    )
    built_accelerator = (
        AcceleratorRegistry.get(accelerator or device_type)
        if accelerator is None or isinstance(accelerator, str)
        # One written as Lightning's are (static methods, counts) is adapted.
        else as_accelerator(accelerator) or accelerator
    )
    _require(built_accelerator, Accelerator, "accelerator")
    built_precision = (
        PrecisionRegistry.get(precision or "32-true", device_type=device_type)
        if precision is None or isinstance(precision, str)
        else precision
    )
    _require(built_precision, Precision, "precision")
    built_io = (
        CheckpointIORegistry.get(checkpoint_io or "torch")
        if checkpoint_io is None or isinstance(checkpoint_io, str)
        else checkpoint_io
    )
    _require(built_io, CheckpointIO, "checkpoint_io")
    return Parts(accelerator=built_accelerator, precision=built_precision, checkpoint_io=built_io)
