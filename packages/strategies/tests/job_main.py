"""A program whose job runs several times on one process group, for the job tests.

Usage: python job_main.py SCENARIO NUM_PROCESSES

Every rank runs the whole program (the ``popen`` launcher). Rank 0 prints one JSON
line per run it saw, then ``end`` and how the job ended.
"""

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from plait.core import PeerFailedError
from plait.strategies import DDPStrategy
from plait.strategies.job import current_job, end_job

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()


def ddp(processes: int, seconds: int = 15) -> DDPStrategy:
    return DDPStrategy(
        accelerator="cpu",
        parallel_devices=[torch.device("cpu")] * processes,
        timeout=timedelta(seconds=seconds),
    )


def run(strategy: DDPStrategy, fail_on: int | None = None) -> dict[str, object]:
    # One run: join (or find) the job's group, reduce, tear down.
    strategy.setup_environment()
    try:
        if strategy.global_rank == fail_on:
            raise ValueError(f"boom on rank {fail_on}")
        total = int(strategy.reduce(strategy.global_rank + 1, reduce_op="sum"))
        group = id(strategy.process_group)
        generation = strategy.job_generation
    finally:
        strategy.teardown()
    return {
        "total": total,
        "group": group,
        "generation": generation,
        "joined_after_teardown": dist.is_initialized(),
    }


def main(scenario: str, processes: int) -> None:
    rank = int(os.environ.get("RANK", "0"))
    seen: list[dict[str, object]] = []
    try:
        first = ddp(processes)
        seen.append(first.launcher.launch(run, first))
        again = ddp(processes)  # a second strategy, the same settings: the same group
        seen.append(again.launcher.launch(run, again))
        if scenario == "settings":
            other = ddp(processes, seconds=16)  # other settings: a group of their own
            seen.append(other.launcher.launch(run, other))
            end_job()  # every rank, at the same point of the program
            seen.append({"ended": not dist.is_initialized() and current_job() is None})
            after = ddp(processes)
            seen.append(after.launcher.launch(run, after))
        elif scenario.startswith("fail"):
            fail_on = int(scenario.removeprefix("fail"))
            late = ddp(processes)
            seen.append(late.launcher.launch(run, late, fail_on))
    except PeerFailedError as error:  # rank 0: another rank failed
        seen.append({"failed": error.rank, "message": str(error)})
    except ValueError as error:
        if rank != 0:
            raise  # a failing rank ends its program, and the job
        seen.append({"raised": str(error)})
    if rank == 0:
        for line in seen:
            print(json.dumps(line), flush=True)
        print("end", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
