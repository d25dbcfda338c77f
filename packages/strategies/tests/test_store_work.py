"""How much the job's store serves per checked collective, counted, not timed.

Rank 0's store serves every rank: work there that grows with the number of ranks
(the store path reads every rank's call) is what keeps checked collectives from
scaling. Through the process group, a checked collective must not touch the store.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

JOB = Path(__file__).resolve().with_name("store_work_job.py")


StartRanks = Callable[..., list[str]]  # the fixture of the root conftest.py


def count_store_work(
    start_ranks: StartRanks, agreement: str, world_size: int, out: Path
) -> list[dict[str, Any]]:
    """Run the counting job as ``world_size`` ranks; return each rank's counts."""
    out.mkdir()
    start_ranks(JOB, [agreement, str(out)], world_size)
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(world_size)]


@pytest.mark.slow
def test_a_checked_collective_through_the_process_group_sends_the_store_nothing(
    tmp_path: Path, start_ranks: StartRanks
) -> None:
    by_size = {n: count_store_work(start_ranks, "backend", n, tmp_path / str(n)) for n in (2, 3, 4)}

    for size, ranks in by_size.items():
        for rank, counts in enumerate(ranks):
            assert counts["path"] == "backend"
            busy = {name: c for name, c in counts["per_call"].items() if c["requests"]}
            assert not busy, f"rank {rank} of {size} asked the store per call: {busy}"
    # A call that waits posts where it waits once and clears it: two requests, on
    # the ranks that waited (the late one did not), however many ranks there are.
    for size, ranks in by_size.items():
        assert ranks[0]["slow_barrier"]["requests"] == 2, size
        assert ranks[-1]["slow_barrier"]["requests"] == 0, size


@pytest.mark.slow
def test_the_store_path_reads_every_rank_s_call_so_its_work_grows_with_the_ranks(
    tmp_path: Path, start_ranks: StartRanks
) -> None:
    # The counter's control: the path that small groups take does ask the store,
    # and more of it with more ranks.
    two, four = (count_store_work(start_ranks, "store", n, tmp_path / str(n)) for n in (2, 4))

    for name in ("reduce 16 floats", "barrier"):
        assert two[0]["per_call"][name]["requests"] > 0
        assert four[0]["per_call"][name]["keys"] > two[0]["per_call"][name]["keys"]
