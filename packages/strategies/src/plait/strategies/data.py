"""Loaders made distributed: each rank gets its share, every epoch shuffled anew.

`prepare_loader` rebuilds a loader for one rank (the Trainer's and
`BaseStrategy.setup_dataloader`'s), and `DistributedLoader` is what
`setup_dataloader` returns: the loader of this rank, which tells its sampler each
epoch, can move batches to the strategy's device, and is `Stateful` (its epoch), so
a resumed run shuffles as the first one would have.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import TYPE_CHECKING, Final, Generic, TypeVar, cast

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

from plait.core import ConfigurationError, SupportsProcessDataloader
from plait.core.seed import SEED_ENV_VAR

if TYPE_CHECKING:
    from plait.core import Strategy

__all__ = [
    "ContiguousShardSampler",
    "DistributedLoader",
    "move_to_device",
    "prepare_loader",
    "sampler_seed",
    "set_epoch",
]

T = TypeVar("T")

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
    loader: Iterable[T],
    *,
    training: bool,
    rank: int,
    world_size: int,
    seed: int = 0,
    shuffle: bool | None = None,
) -> Iterable[T]:
    """The loader each rank iterates.

    A `DataLoader` with the default sampler (sequential, or random from
    ``shuffle=True``) is rebuilt: for training with a `DistributedSampler` (also
    with one process, so that each epoch's order follows from the seed and the
    epoch alone, which is what makes resuming exact), shuffled from ``seed``; for
    evaluation, with more than one process, with a `ContiguousShardSampler`. A sampler
    or batch sampler of your own, an iterable dataset, or any other iterable is used
    as it is. ``shuffle=False`` keeps a training loader in order even where it was
    made with ``shuffle=True`` (the same batches every epoch).

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
        shuffled = type(sampler) is RandomSampler and shuffle is not False
        if world_size == 1 and type(sampler) is SequentialSampler:
            return loader
        new_sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=shuffled, seed=seed
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


def move_to_device(data: T, device: torch.device) -> T:
    """``data`` with every tensor (in tuples, lists and dicts, at any depth) on ``device``."""

    def move(item: object) -> object:
        if isinstance(item, torch.Tensor):
            return item if item.device == device else item.to(device, non_blocking=True)
        if isinstance(item, Mapping):
            return type(item)({key: move(value) for key, value in item.items()})  # type: ignore[call-arg]
        if isinstance(item, tuple) and hasattr(item, "_fields"):  # a named tuple
            return type(item)(*[move(value) for value in item])  # type: ignore[arg-type]
        if isinstance(item, list | tuple):
            return type(item)(move(value) for value in item)
        return item

    moved: T = move(data)  # type: ignore[assignment]
    return moved


class DistributedLoader(Generic[T]):
    """This rank's loader, as `BaseStrategy.setup_dataloader` makes it.

    Each pass over it is an epoch: it tells a `DistributedSampler` the epoch first
    (so each epoch is shuffled anew, the same way on every rank), and counts it.
    Save it with the rest of a run (``save_checkpoint({..., "loader": loader})``):
    its state is the epoch, and a resumed run shuffles as the first would have.

    Attributes:
        loader: The loader it iterates (rebuilt with this rank's sampler).
        epoch: The epoch its next pass is.
    """

    def __init__(
        self,
        loader: Iterable[T],
        *,
        device: torch.device | None = None,
        process: Callable[[Iterable[T]], Iterable[T]] | None = None,
    ) -> None:
        self.loader = loader
        self.epoch = 0
        self._device = device
        self._process = process

    def __iter__(self) -> Iterator[T]:
        """One epoch of this rank's batches (on the strategy's device, if asked)."""
        set_epoch(self.loader, self.epoch)
        self.epoch += 1
        batches = self._process(self.loader) if self._process is not None else self.loader
        if self._device is None:
            yield from batches
            return
        for batch in batches:
            yield move_to_device(batch, self._device)

    def __len__(self) -> int:
        """The batches in one epoch of this rank.

        Raises:
            TypeError: The loader has no length (an iterable dataset).
        """
        if not isinstance(self.loader, Sized):
            raise TypeError(f"a {type(self.loader).__name__} has no length")
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the next pass's epoch (to begin a resumed run mid-way)."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, object]:
        """The epoch of the next pass."""
        return {"epoch": self.epoch}

    def load_state_dict(self, state_dict: Mapping[str, object]) -> None:
        """Take back what `state_dict` returned."""
        epoch = state_dict["epoch"]
        if not isinstance(epoch, int):
            raise ConfigurationError(
                f"a loader's state holds the epoch {epoch!r}, not a number",
                value=epoch,
                fix="load the state a DistributedLoader's state_dict() returned",
            )
        self.epoch = epoch

    @override
    def __repr__(self) -> str:
        return f"DistributedLoader(epoch={self.epoch}, loader={self.loader!r})"


def setup_dataloader(
    strategy: Strategy,
    loader: Iterable[T],
    *,
    evaluation: bool = False,
    move_to_device: bool = False,
    use_distributed_sampler: bool = True,
) -> DistributedLoader[T]:
    """``loader`` made this rank's: the body of `BaseStrategy.setup_dataloader`."""
    layout = strategy.layout
    world_size, rank = layout.data_parallel_size, layout.data_parallel_rank
    prepared = loader
    if use_distributed_sampler:
        prepared = prepare_loader(
            loader, training=not evaluation, rank=rank, world_size=world_size, seed=sampler_seed()
        )
        if prepared is loader and world_size > 1 and not _sharded(loader):
            raise ConfigurationError(
                f"the {_what(loader)} cannot be given a DistributedSampler, and as it is every "
                f"one of the {world_size} data-parallel ranks would read all of it",
                value=loader,
                fix="shard it yourself (by strategy.layout.data_parallel_rank and "
                "data_parallel_size) and pass use_distributed_sampler=False, or use a "
                "DataLoader with the default sampler (shuffle=True or False)",
            )
    process: Callable[[Iterable[T]], Iterable[T]] | None = None
    if isinstance(strategy, SupportsProcessDataloader):
        # The device loader (XLA's) yields the same batches, placed on the device.
        process = cast("Callable[[Iterable[T]], Iterable[T]]", strategy.process_dataloader)
    device = strategy.root_device if move_to_device and process is None else None
    return DistributedLoader(prepared, device=device, process=process)


def _sharded(loader: Iterable[object]) -> bool:
    if not isinstance(loader, DataLoader):
        return False
    samplers = (loader.sampler, getattr(loader.batch_sampler, "sampler", None))
    return any(isinstance(s, DistributedSampler | ContiguousShardSampler) for s in samplers)


def _what(loader: Iterable[object]) -> str:
    if not isinstance(loader, DataLoader):
        return f"{type(loader).__name__} (not a DataLoader)"
    if isinstance(loader.dataset, IterableDataset):
        return "DataLoader over an iterable dataset"
    return f"DataLoader with a sampler of its own ({type(loader.sampler).__name__})"
