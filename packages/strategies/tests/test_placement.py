"""The start-up layout check: what it refuses, and that every rank refuses alike."""

from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import torch

from plait.core import ConfigurationError
from plait.strategies.placement import (
    Placement,
    check_placements,
    placement_of,
    shares_devices,
)

StartRanks = Callable[..., list[str]]  # the fixture of the root conftest.py

SCRIPT = Path(__file__).resolve().parent / "placement_main.py"
TORCHRUN = {"local_rank": "LOCAL_RANK", "node_rank": "GROUP_RANK"}


def place(
    rank: int, local: int, node: int, host: str, *, device: str = "cpu", gpu: str | None = None
) -> Placement:
    return Placement(
        rank=rank, local_rank=local, node_rank=node, host=host, device=device, device_id=gpu
    )


def two_by_two() -> list[Placement]:
    """Ranks 0-3 on hosts a and b, each rank on a GPU of its own."""
    return [
        place(
            rank, rank % 2, rank // 2, "ab"[rank // 2], device=f"cuda:{rank % 2}", gpu=f"GPU-{rank}"
        )
        for rank in range(4)
    ]


def test_a_sound_layout_passes() -> None:
    assert check_placements(two_by_two(), TORCHRUN) is None
    # CPU processes share the machine's one device by design.
    assert check_placements([place(rank, rank, 0, "a") for rank in range(4)]) is None


def test_two_ranks_on_one_gpu_are_named_with_the_device_and_the_fix() -> None:
    # srun --gpu-bind gave ranks 2 and 3 the same GPU, each seeing it as cuda:0.
    placements = two_by_two()
    placements[3] = attrs.evolve(placements[3], device="cuda:0", device_id="GPU-2")
    error = check_placements(placements, TORCHRUN)

    assert isinstance(error, ConfigurationError)
    message = str(error)
    assert "ranks 2 and 3 use the same device, GPU-2" in message
    assert "rank 2 as cuda:0 on 'b', rank 3 as cuda:0 on 'b'" in message
    assert error.fix is not None
    assert "--nproc-per-node" in error.fix
    assert "--gpu-bind" in error.fix
    assert "(LOCAL_RANK)" in error.fix


def test_ranks_may_share_a_gpu_over_gloo_only_and_still_need_their_own_local_ranks() -> None:
    placements = two_by_two()
    placements[3] = attrs.evolve(placements[3], device="cuda:0", device_id="GPU-2")

    assert shares_devices("gloo")
    assert not shares_devices("nccl")
    assert check_placements(placements, TORCHRUN, shared_devices=shares_devices("gloo")) is None
    error = check_placements(placements, TORCHRUN, shared_devices=shares_devices("nccl"))
    assert error is not None
    assert error.fix is not None
    assert "process_group_backend='gloo'" in error.fix
    # Sharing a GPU is not sharing a local rank.
    placements[3] = attrs.evolve(placements[3], local_rank=0)
    clash = check_placements(placements, TORCHRUN, shared_devices=True)
    assert clash is not None
    assert "ranks 2 and 3 say they are local rank 0" in str(clash)


def test_one_local_rank_claimed_twice_on_a_node_is_named() -> None:
    error = check_placements(
        [place(0, 0, 0, "a"), place(1, 0, 0, "a"), place(2, 0, 1, "b")], TORCHRUN
    )

    assert error is not None
    assert "ranks 0 and 1 say they are local rank 0 (LOCAL_RANK) on node 0 (GROUP_RANK)" in str(
        error
    )


def test_a_node_spread_over_two_hosts_is_named_with_each_hosts_ranks() -> None:
    # Two agents both started with --node-rank=0.
    error = check_placements(
        [place(0, 0, 0, "a"), place(1, 1, 0, "a"), place(2, 0, 0, "b")], TORCHRUN
    )

    assert error is not None
    assert "ranks 0 and 2 say they are local rank 0" in str(error)  # the first problem found
    error = check_placements(
        [place(0, 0, 0, "a"), place(1, 1, 0, "a"), place(2, 2, 0, "b"), place(3, 3, 0, "b")]
    )
    assert error is not None
    assert "node 0 is on 2 hosts ('a': ranks 0 and 1; 'b': ranks 2 and 3)" in str(error)
    assert error.fix is not None
    assert "--node-rank" in error.fix


def test_a_placement_travels_as_json() -> None:
    placement = place(3, 1, 1, "b", device="cuda:1", gpu="GPU-3")

    assert Placement.decode(placement.encode()) == placement


def test_the_cpu_is_never_compared() -> None:
    class Env:
        global_rank = 1
        local_rank = 1
        node_rank = 0

    placement = placement_of(Env(), torch.device("cpu"))  # type: ignore[arg-type]

    assert (placement.rank, placement.device, placement.device_id) == (1, "cpu", None)


@pytest.mark.slow
def test_two_ranks_claiming_one_local_rank_are_refused_on_every_rank(
    start_ranks: StartRanks,
) -> None:
    outputs = start_ranks(SCRIPT, [], 3, per_rank=lambda rank: {"LOCAL_RANK": str(rank % 2)})

    for output in outputs:
        assert "refused: ranks 0 and 2 say they are local rank 0 (LOCAL_RANK) on node 0" in output


@pytest.mark.slow
def test_one_node_on_two_hosts_is_refused_on_every_rank(start_ranks: StartRanks) -> None:
    outputs = start_ranks(SCRIPT, [], 2, per_rank=lambda rank: {"HOST_NAME": f"host{rank}"})

    for output in outputs:
        assert "refused: node 0 (NODE_RANK) is on 2 hosts ('host0': rank 0; 'host1': rank 1)" in (
            output
        )


@pytest.mark.slow
def test_a_sound_layout_joins_and_works(start_ranks: StartRanks) -> None:
    outputs = start_ranks(
        SCRIPT,
        [],
        4,
        per_rank=lambda rank: {
            "HOST_NAME": f"host{rank // 2}",
            "NODE_RANK": str(rank // 2),
            "LOCAL_RANK": str(rank % 2),
        },
    )

    assert [line.split(";")[0] for line in outputs] == [f"rank {r} joined" for r in range(4)]
    assert all("the ranks sum to 6" in output for output in outputs)


@pytest.mark.cuda
def test_a_gpu_is_named_by_its_uuid_whatever_its_index_in_this_process() -> None:
    class Env:
        global_rank = 0
        local_rank = 0
        node_rank = 0

    placement = placement_of(Env(), torch.device("cuda", 0))  # type: ignore[arg-type]

    uuid = str(torch.cuda.get_device_properties(0).uuid)
    assert placement.device_id == f"GPU-{uuid}"
