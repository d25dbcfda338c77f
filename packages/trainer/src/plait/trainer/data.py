"""Loaders made distributed: each rank gets its share, every epoch shuffled anew."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Final

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)
from typing_extensions import override

from plait.core import ConfigurationError
from plait.core.seed import SEED_ENV_VAR

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

_LOADER_ARGUMENTS: Final = (
    "batch_size",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "persistent_workers",
    "pin_memory_device",
)


class ContiguousShardSampler(Sampler[int]):
    """Each index exactly once across ranks: rank r takes the r-th contiguous block.

    For evaluation and prediction: nothing is repeated (metrics count each sample
    once), and rank 0's outputs followed by rank 1's are in the dataset's order.
    Ranks may hold one sample more than others.
    """

    def __init__(self, size: int, *, rank: int, world_size: int) -> None:
        per_rank, extra = divmod(size, world_size)
        self.start = rank * per_rank + min(rank, extra)
        self.stop = self.start + per_rank + (1 if rank < extra else 0)

    @override
    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start


def sampler_seed() -> int:
    """The seed of the training samplers: the global seed (`seed_everything`), else 0."""
    return int(os.environ.get(SEED_ENV_VAR, "0"))


def prepare_loader(  # noqa: PLR0911 (each return is a case left as the user made it)
    loader: Iterable[object], *, training: bool, rank: int, world_size: int, seed: int = 0
) -> Iterable[object]:
    """The loader each rank iterates.

    A `DataLoader` with the default sampler (sequential, or random from
    ``shuffle=True``) is rebuilt: for training with a `DistributedSampler` (also
    with one process, so that each epoch's order follows from the seed and the
    epoch alone, which is what makes resuming exact), shuffled from ``seed``; for
    evaluation, with more than one process, with a `ContiguousShardSampler`. A sampler
    or batch sampler of your own, an iterable dataset, or any other iterable is used
    as it is.

    Raises:
        ConfigurationError: ``loader`` is not iterable.
    """
    if not isinstance(loader, Iterable):
        raise ConfigurationError(
            f"a loader must be iterable, got a {type(loader).__name__}",
            value=loader,
            fix="pass a torch.utils.data.DataLoader (or any iterable of batches)",
        )
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    batch_sampler = loader.batch_sampler
    if batch_sampler is None or type(batch_sampler) is not BatchSampler:
        return loader  # the user's own batch sampler
    sampler = loader.sampler
    if type(sampler) not in (RandomSampler, SequentialSampler):
        return loader  # the user's own sampler
    dataset = loader.dataset
    if not isinstance(dataset, Sized):
        return loader
    new_sampler: Sampler[int]
    if training:
        shuffle = type(sampler) is RandomSampler
        if world_size == 1 and not shuffle:
            return loader
        new_sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed
        )
    else:
        if world_size == 1:
            return loader
        new_sampler = ContiguousShardSampler(len(dataset), rank=rank, world_size=world_size)
    arguments = {name: getattr(loader, name) for name in _LOADER_ARGUMENTS if hasattr(loader, name)}
    if loader.num_workers > 0:
        arguments["prefetch_factor"] = loader.prefetch_factor
    else:
        arguments["persistent_workers"] = False
    return DataLoader(dataset, sampler=new_sampler, **arguments)


def set_epoch(loader: Iterable[object], epoch: int) -> None:
    """Tell the loader's sampler which epoch starts, when it can use it (shuffling)."""
    if not isinstance(loader, DataLoader):
        return
    for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)


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
