"""What the precision plugins share: casting nested data, clipping, the default dtype."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Final, TypeVar

import torch

from plait.core import ConfigurationError, GradientClipAlgorithm

__all__ = [
    "LEAF_TYPES",
    "check_clip",
    "convert_floats",
    "default_dtype",
    "map_tensors",
    "parameters_with_gradients",
]

T = TypeVar("T")

_ALGORITHMS: Final = ("norm", "value")

# Formats a device cannot run, with the reason, checked when a plugin is made.
UNSUPPORTED: Final[Mapping[tuple[str, str], str]] = {
    ("64-true", "mps"): "MPS has no float64",
    ("64-true", "xla"): "TPUs have no float64",
}


def check_supported(name: str, device_type: str) -> None:
    """Raise if ``device_type`` cannot run the format ``name``.

    Raises:
        ConfigurationError: It cannot; the message says why and what to use.
    """
    reason = UNSUPPORTED.get((name, device_type))
    if reason is not None:
        raise ConfigurationError(
            f"precision {name!r} cannot run on {device_type}: {reason}",
            value=name,
            fix="use precision='32-true', or 'bf16-mixed' to save memory",
        )


def convert_floats(data: T, dtype: torch.dtype) -> T:
    """Cast every floating tensor in ``data`` (nested dicts, lists, tuples) to ``dtype``.

    What needs no cast is returned as it is, containers included: a batch already in
    ``dtype`` (the usual case) costs a walk, not a copy.
    """
    if _in_dtype(data, dtype):  # the usual batch: a walk without a call per tensor
        return data

    def cast_float(tensor: torch.Tensor) -> torch.Tensor:
        # The dtype is compared first: even a no-op `to` dispatches into torch.
        if tensor.dtype == dtype or not tensor.is_floating_point():
            return tensor
        return tensor.to(dtype)

    return map_tensors(data, cast_float)


def _in_dtype(data: object, dtype: torch.dtype) -> bool:
    """Whether ``data`` (tuples and lists of plain tensors and leaves) needs no cast to ``dtype``.

    ``False`` where it cannot tell at once (any other container, a tensor subclass):
    `map_tensors` then walks it, and still returns what needs no cast as it is.
    """
    kind = type(data)
    if kind is torch.Tensor:
        return data.dtype == dtype or not data.is_floating_point()  # type: ignore[attr-defined]
    if kind is not tuple and kind is not list:
        return kind in LEAF_TYPES
    for item in data:  # type: ignore[attr-defined]
        kind = type(item)
        if kind is torch.Tensor:
            if item.dtype != dtype and item.is_floating_point():
                return False
        elif kind not in LEAF_TYPES and not _in_dtype(item, dtype):
            return False
    return True


LEAF_TYPES: Final = frozenset({int, float, bool, str, bytes, type(None)})
"""Types that hold no tensor: a walk over a batch checks them by identity before any
isinstance (`map_tensors` here, and the quick looks at a batch before a walk)."""


def map_tensors(data: T, function: Callable[[torch.Tensor], torch.Tensor]) -> T:  # noqa: PLR0911 (one return per kind)
    """``data`` with ``function`` applied to every tensor in it, at any depth.

    Dicts (any mapping), lists, tuples and named tuples are walked.

    A container none of whose tensors ``function`` replaced is returned as it is, not
    copied: the usual batch, already as wanted, costs a walk.
    """
    kind = type(data)
    if kind in LEAF_TYPES:
        return data
    if isinstance(data, torch.Tensor):
        return function(data)  # type: ignore[return-value]
    if kind is tuple or kind is list:  # the usual batch: checked before the ABCs
        replaced = _map_items(data, function)  # type: ignore[arg-type]
        if replaced is None:
            return data
        return tuple(replaced) if kind is tuple else replaced  # type: ignore[return-value]
    if isinstance(data, Mapping):
        mapped = {key: map_tensors(value, function) for key, value in data.items()}
        if all(mapped[key] is value for key, value in data.items()):
            return data
        return type(data)(mapped)  # type: ignore[call-arg]
    if isinstance(data, list | tuple):
        replaced = _map_items(data, function)
        if replaced is None:
            return data
        rebuild: Callable[..., T] = type(data)
        if hasattr(data, "_fields"):  # a named tuple
            return rebuild(*replaced)
        return rebuild(replaced)
    return data


def _map_items(
    items: tuple[object, ...] | list[object], function: Callable[[torch.Tensor], torch.Tensor]
) -> list[object] | None:
    """``items`` mapped by `map_tensors`, or ``None`` when every one came back as it was."""
    replaced: list[object] | None = None
    for index, item in enumerate(items):
        # Tensors and leaves (the usual batch's items) are handled here, without a call.
        new: object
        if isinstance(item, torch.Tensor):
            new = function(item)
        elif type(item) in LEAF_TYPES:
            continue
        else:
            new = map_tensors(item, function)
        if new is not item:
            if replaced is None:
                replaced = list(items)
            replaced[index] = new
    return replaced


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Make ``dtype`` the default for new floating tensors inside the block."""
    previous = torch.get_default_dtype()
    if previous == dtype:  # the usual case (float32): nothing to set or restore
        yield
        return
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def check_clip(clip_val: float, algorithm: GradientClipAlgorithm) -> bool:
    """Whether to clip: ``clip_val`` 0 means no clipping, as in Lightning.

    Raises:
        ConfigurationError: ``clip_val`` is negative or not a number, or
            ``algorithm`` is unknown.
    """
    if algorithm not in _ALGORITHMS:
        raise ConfigurationError.invalid_choice("gradient_clip_algorithm", algorithm, _ALGORITHMS)
    given: object = clip_val  # checked as the object it is: callers pass user input
    if isinstance(given, bool) or not isinstance(given, int | float) or given < 0:
        raise ConfigurationError(
            f"gradient_clip_val={clip_val!r} must be a number of at least 0 (0: no clipping)",
            value=clip_val,
            fix="pass e.g. gradient_clip_val=1.0, or 0 (or None) not to clip",
        )
    return given > 0


def parameters_with_gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """``optimizer``'s parameters that have a gradient."""
    return [
        parameter
        for group in optimizer.param_groups
        for parameter in group["params"]
        if parameter.grad is not None
    ]
