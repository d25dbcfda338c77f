"""Every rank's object in two collectives, however many ranks there are."""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import pytest
import torch

from plait.strategies.collectives import LocalCollectives
from plait.trainer.gather import gather_objects


class SimulatedRanks:
    """This rank's ``all_gather`` among ranks whose objects are known in advance.

    Rows of the other ranks are what they would send: their pickle's length, then
    their pickle padded to the longest. Counts the collectives it is asked for.
    """

    def __init__(self, others: Sequence[object]) -> None:
        self.pickles = [pickle.dumps(other) for other in others]
        self.calls = 0

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if tensor.dtype == torch.int64:  # the lengths
            lengths = [len(data) for data in self.pickles]
            return torch.stack([tensor, *(torch.tensor([n]) for n in lengths)])
        rows = [tensor]
        for data in self.pickles:
            row = torch.zeros_like(tensor)
            row[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            rows.append(row)
        return torch.stack(rows)


@pytest.mark.parametrize("world_size", [2, 3, 64, 1024])
def test_objects_of_every_size_come_back_in_rank_order_in_two_collectives(
    world_size: int,
) -> None:
    others: list[dict[str, object]] = [
        {"rank": rank, "pad": "x" * (rank % 7) * 100} for rank in range(1, world_size)
    ]
    ranks = SimulatedRanks(others)

    mine: dict[str, object] = {"rank": 0, "tensor": torch.arange(3)}

    gathered = gather_objects(ranks, mine)

    assert ranks.calls == 2  # not one per rank
    assert gathered[1:] == others
    tensor = gathered[0]["tensor"]
    assert isinstance(tensor, torch.Tensor)
    assert torch.equal(tensor, torch.arange(3))


def test_one_process_gets_its_own_object_back() -> None:
    assert gather_objects(LocalCollectives(torch.device("cpu")), ["a", 1]) == [["a", 1]]
