"""The Trainer's loaders: their lengths, limits and batch sizes.

Making them distributed is `plait.strategies.data`'s (imported here for the loops).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sized

import torch

from plait.core import ConfigurationError
from plait.strategies.data import ContiguousShardSampler, prepare_loader, sampler_seed, set_epoch

__all__ = [
    "ContiguousShardSampler",
    "check_limit",
    "first_tensor_length",
    "length",
    "limit_batches",
    "prepare_loader",
    "sampler_seed",
    "set_epoch",
]


def length(loader: Iterable[object]) -> int | None:
    """How many batches the loader yields, or ``None`` when it cannot say."""
    if not isinstance(loader, Sized):
        return None
    try:
        return len(loader)
    except TypeError:  # a DataLoader over an iterable dataset without __len__
        return None


def limit_batches(available: int | None, limit: int | float, what: str) -> int | None:
    """How many batches to run: ``limit`` as a count, or as a fraction of ``available``.

    Raises:
        ConfigurationError: A fraction of a loader without a length.
    """
    if isinstance(limit, float):
        if limit == 1.0:
            return available
        if available is None:
            raise ConfigurationError(
                f"{what}={limit} is a fraction of the loader's length, and the loader has none",
                value=limit,
                fix=f"pass a number of batches, e.g. {what}=100",
            )
        return max(1, int(available * limit)) if limit > 0 and available > 0 else 0
    return limit if available is None else min(limit, available)


def check_limit(name: str, value: object) -> int | float:
    """A ``limit_*_batches`` or similar value: a count of at least 0, or a fraction in [0, 1].

    Raises:
        ConfigurationError: It is neither.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{name}={value!r} must be an int (batches) or a float in [0.0, 1.0] (a fraction)",
            value=value,
            fix=f"pass e.g. {name}=1.0 (all) or {name}=10",
        )
    if (isinstance(value, float) and not (0.0 <= value <= 1.0)) or (
        isinstance(value, float) and math.isnan(value)
    ):
        raise ConfigurationError(
            f"{name}={value!r}: a fraction must lie in [0.0, 1.0]",
            value=value,
            fix=f"pass {name}=1.0 for every batch, or an int for a number of batches",
        )
    if isinstance(value, int) and value < 0:
        raise ConfigurationError(
            f"{name}={value!r}: a number of batches is at least 0",
            value=value,
            fix=f"pass {name}=0 to skip, or a positive number",
        )
    return value


def first_tensor_length(batch: object) -> int:
    """The batch size as the length of the first tensor found in ``batch`` (1 if none)."""
    found = _find(batch)
    return 1 if found is None else found


def _find(item: object) -> int | None:
    if isinstance(item, torch.Tensor):
        return int(item.shape[0]) if item.dim() > 0 else 1
    if isinstance(item, Mapping):
        item = list(item.values())
    if isinstance(item, list | tuple):
        for part in item:
            found = _find(part)
            if found is not None:
                return found
    return None
