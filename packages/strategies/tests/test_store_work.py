"""How much the job's store serves per checked collective, counted, not timed.

Rank 0's store serves every rank: work there that grows with the number of ranks
(the store path reads every rank's call) is what keeps checked collectives from
scaling. Through the process group, a checked collective must not touch the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from plait.core import free_port

JOB = Path(__file__).resolve().with_name("store_work_job.py")


def count_store_work(agreement: str, world_size: int, out: Path) -> list[dict[str, Any]]:
    """Run the counting job as ``world_size`` ranks; return each rank's counts."""
    out.mkdir()
    base = {
        **os.environ,
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world_size),
        "OMP_NUM_THREADS": "1",
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, str(JOB), agreement, str(out)],
            env={**base, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world_size)
    ]
    deadline = time.monotonic() + 120
    try:
        outputs = [
            process.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
            for process in ranks
        ]
    finally:
        for process in ranks:
            process.kill()
            process.wait(timeout=30)
            if process.stdout is not None:
                process.stdout.close()
    assert [process.returncode for process in ranks] == [0] * world_size, "\n".join(outputs)
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(world_size)]


@pytest.mark.slow
def test_a_checked_collective_through_the_process_group_sends_the_store_nothing(
    tmp_path: Path,
) -> None:
    by_size = {n: count_store_work("backend", n, tmp_path / str(n)) for n in (2, 3, 4)}

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
    tmp_path: Path,
) -> None:
    # The counter's control: the path that small groups take does ask the store,
    # and more of it with more ranks.
    two, four = (count_store_work("store", n, tmp_path / str(n)) for n in (2, 4))

    for name in ("reduce 16 floats", "barrier"):
        assert two[0]["per_call"][name]["requests"] > 0
        assert four[0]["per_call"][name]["keys"] > two[0]["per_call"][name]["keys"]
