"""The batches every rank runs: as many on each rank, agreed between them.

A rank that ran more forwards than another would wait for it in a collective
forever; these generators are where the ranks agree on how many there are.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator

import torch

from plait.core import Strategy, SupportsProcessDataloader, rank_zero_warn
from plait.trainer.data import prepare_loader

__all__ = ["agreed_total", "batches", "device_loader", "evaluation_loader", "even_batches"]


def device_loader(strategy: Strategy, loader: Iterable[object]) -> Iterable[object]:
    """The strategy's wrapper (XLA's device loader) around a loader the trainer prepared.

    The prepared loader itself keeps receiving ``set_epoch`` and being measured.
    """
    if isinstance(strategy, SupportsProcessDataloader):
        return strategy.process_dataloader(loader)
    return loader


def evaluation_loader(strategy: Strategy, loader: Iterable[object]) -> Iterable[object]:
    """``loader`` split between the data-parallel ranks, in order, for evaluation."""
    layout = strategy.layout
    return prepare_loader(
        loader,
        training=False,
        rank=layout.data_parallel_rank,
        world_size=layout.data_parallel_size,
    )


def agreed_total(strategy: Strategy, limited: int | None) -> int | None:
    """The training batches every rank runs: the least any rank holds (``None``: unknown)."""
    if strategy.world_size == 1 or limited is None:
        return limited
    # Every rank must run as many batches as the others, or one would wait in a
    # gradient all-reduce for a rank that has finished: take the least.
    fewest = int(strategy.reduce(limited, reduce_op="min"))
    if fewest != limited:
        rank_zero_warn(f"the ranks hold different numbers of training batches; each runs {fewest}")
    return fewest


def batches(
    strategy: Strategy, loader: Iterable[object], total: int | None
) -> Iterator[tuple[int, object]]:
    """``(index, batch)`` for ``total`` batches, or, without a total, while every rank has one.

    The loader's iterator is made at once (a DataLoader draws its order then).
    """
    iterator = iter(device_loader(strategy, loader))
    if total is not None:  # agreed already: nothing to ask per batch, no frame of ours
        return enumerate(itertools.islice(iterator, total))
    if strategy.world_size == 1:
        return enumerate(iterator)
    return _while_every_rank_has_one(strategy, iterator)


def _while_every_rank_has_one(
    strategy: Strategy, iterator: Iterator[object]
) -> Iterator[tuple[int, object]]:
    # A loader without a length: the ranks agree, batch by batch, to go on only
    # while every one of them has a batch.
    index = 0
    while True:
        try:
            batch = next(iterator)
            more = True
        except StopIteration:
            batch, more = None, False
        if not strategy.reduce_boolean_decision(more, all=True):
            return
        yield index, batch
        index += 1


def even_batches(
    strategy: Strategy, loader: Iterable[object], total: int | None
) -> Iterator[tuple[int, object, bool]]:
    """``(index, batch, real)`` until no rank has a batch left.

    A rank whose own batches ran out gets its last batch again with ``real``
    false (or, having had none, the first batch of the first rank that has one).
    """
    world = strategy.world_size
    device = strategy.root_device
    counts = None
    if world > 1 and total is not None:
        counts = strategy.all_gather(torch.tensor([total], device=device)).flatten().tolist()
    iterator = iter(device_loader(strategy, loader))
    last: object = None
    had_one = False
    index = 0
    while True:
        batch, more = None, False
        if total is None or index < total:
            with contextlib.suppress(StopIteration):
                batch, more = next(iterator), True
        if world == 1:
            if not more:
                return
            yield index, batch, True
            index += 1
            continue
        if counts is not None:
            holding = [count > index for count in counts]
        else:
            # Without lengths, the ranks say at each batch which of them has one.
            flag = torch.tensor([more], device=device)
            holding = [bool(f) for f in strategy.all_gather(flag).flatten().tolist()]
        if not any(holding):
            return
        if index == 0 and not all(holding):
            # A rank without any batch pads with another rank's first.
            giver = holding.index(True)
            last = strategy.broadcast(batch if strategy.global_rank == giver else None, src=giver)
            had_one = True
        if more:
            last, had_one = batch, True
            yield index, batch, True
        else:
            assert had_one
            yield index, last, False
        index += 1
