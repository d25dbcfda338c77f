"""strategy.setup_dataloader: each data-parallel rank its share, each epoch shuffled anew.

A strategy's place is its `layout`; a subclass that claims another place stands in
for the ranks of a real group, whose process layout is all the loader reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler, TensorDataset
from typing_extensions import override

from plait.core import ConfigurationError, ProcessLayout, seed_everything
from plait.strategies import SingleDeviceStrategy
from plait.strategies.data import DistributedLoader

DATA = TensorDataset(torch.arange(10).float())


class RankOf(SingleDeviceStrategy):
    """One of ``size`` data-parallel ranks, as far as the loader can tell."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__("cpu")
        self._place = ProcessLayout(
            world_size=size, global_rank=rank, data_parallel_size=size, data_parallel_rank=rank
        )

    @property
    @override
    def layout(self) -> ProcessLayout:
        return self._place


def _samples(loader: Iterable[object]) -> list[int]:
    seen = []
    for batch in loader:
        assert isinstance(batch, list)
        seen += [int(value) for value in batch[0]]
    return seen


def test_each_rank_reads_its_share_and_each_epoch_is_shuffled_anew_alike_on_every_rank() -> None:
    seed_everything(7)
    ranks = [
        RankOf(rank, 2).setup_dataloader(DataLoader(DATA, batch_size=2, shuffle=True))
        for rank in range(2)
    ]

    first = [_samples(loader) for loader in ranks]
    second = [_samples(loader) for loader in ranks]

    for epoch in (first, second):
        assert sorted(epoch[0] + epoch[1]) == list(range(10))  # disjoint, and all of it
    assert first != second  # the sampler was told the epoch
    assert [loader.epoch for loader in ranks] == [2, 2]
    assert len(ranks[0]) == 3  # 5 samples a rank, in batches of 2


def test_a_resumed_loader_shuffles_as_the_first_run_would_have() -> None:
    seed_everything(7)
    loader = SingleDeviceStrategy().setup_dataloader(DataLoader(DATA, batch_size=4, shuffle=True))
    _samples(loader)
    state = loader.state_dict()
    expected = _samples(loader)

    resumed = SingleDeviceStrategy().setup_dataloader(DataLoader(DATA, batch_size=4, shuffle=True))
    resumed.load_state_dict(state)

    assert state == {"epoch": 1}
    assert _samples(resumed) == expected


def test_evaluation_gives_each_sample_to_one_rank_in_order() -> None:
    shares = [
        _samples(RankOf(rank, 3).setup_dataloader(DataLoader(DATA), evaluation=True))
        for rank in range(3)
    ]

    assert shares == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_drop_last_and_the_batch_size_are_kept() -> None:
    loader = RankOf(0, 2).setup_dataloader(DataLoader(DATA, batch_size=2, drop_last=True))

    assert isinstance(loader.loader, DataLoader)
    assert loader.loader.drop_last
    assert loader.loader.batch_size == 2
    assert len(loader) == 2


class Reversed(SequentialSampler):
    """A sampler of the user's own."""

    @override
    def __iter__(self) -> Iterator[int]:
        return iter(reversed(range(len(self.data_source))))


@pytest.mark.parametrize(
    ("loader", "what"),
    [
        (DataLoader(DATA, sampler=Reversed(DATA)), "a sampler of its own (Reversed)"),
        ([torch.zeros(2)], "list (not a DataLoader)"),
    ],
    ids=["own-sampler", "not-a-loader"],
)
def test_a_loader_every_rank_would_read_whole_is_refused_naming_the_way_out(
    loader: Iterable[object], what: str
) -> None:
    with pytest.raises(
        ConfigurationError, match=r"every one of the 2 data-parallel ranks"
    ) as caught:
        RankOf(0, 2).setup_dataloader(loader)
    assert what in str(caught.value)
    assert "use_distributed_sampler=False" in str(caught.value.fix)

    kept = RankOf(0, 2).setup_dataloader(loader, use_distributed_sampler=False)
    assert kept.loader is loader  # sharded by its owner: left as it is


def test_one_process_keeps_a_sampler_of_its_own() -> None:
    loader = DataLoader(DATA, sampler=Reversed(DATA))

    assert _samples(SingleDeviceStrategy().setup_dataloader(loader)) == list(range(9, -1, -1))


class OnMeta(SingleDeviceStrategy):
    @property
    @override
    def root_device(self) -> torch.device:
        return torch.device("meta")


def test_batches_move_to_the_strategy_device_when_asked() -> None:
    strategy = OnMeta()
    moved = next(
        iter(strategy.setup_dataloader(DataLoader(DATA, batch_size=5), move_to_device=True))
    )
    kept = next(iter(strategy.setup_dataloader(DataLoader(DATA, batch_size=5))))

    assert isinstance(moved, list)
    assert isinstance(kept, list)
    assert moved[0].device == torch.device("meta")
    assert kept[0].device == torch.device("cpu")


def test_a_loader_state_that_is_not_an_epoch_is_refused() -> None:
    loader: DistributedLoader[object] = DistributedLoader([])

    with pytest.raises(ConfigurationError, match="holds the epoch 'one', not a number"):
        loader.load_state_dict({"epoch": "one"})
