"""A program that launches ranks, for the launcher tests.

Usage: python launch_main.py SCENARIO START_METHOD NUM_PROCESSES

Prints what the launcher returned or raised, and how many child processes are left.
"""

import multiprocessing
import os
import signal
import sys
from datetime import timedelta

import torch

from plait.core import PeerFailedError
from plait.strategies import DDPStrategy
from plait.strategies.launchers import MultiprocessingLauncher


def joined() -> DDPStrategy:
    strategy = DDPStrategy(accelerator="cpu", timeout=timedelta(seconds=60))
    strategy.setup_environment()
    return strategy


def sum_of_ranks(offset: int) -> int:
    strategy = joined()
    try:
        return int(strategy.reduce(strategy.global_rank + offset, "sum"))
    finally:
        strategy.teardown()


def big_result() -> torch.Tensor:
    # Far larger than a pipe's buffer: the launcher must read it while rank 0 sends.
    return torch.full((1 << 20,), float(os.environ["RANK"]))


def rank_one_fails() -> None:
    strategy = joined()
    if strategy.global_rank == 1:
        raise ValueError("boom on rank 1")
    strategy.barrier("never complete")  # stopped by the launcher, not by a timeout


def rank_one_is_killed() -> None:
    strategy = joined()
    if strategy.global_rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    strategy.barrier("never complete")


def main(scenario: str, start_method: str, num_processes: int) -> None:
    launcher = MultiprocessingLauncher(num_processes, start_method=start_method)
    try:
        if scenario == "sum":
            print(f"result={launcher.launch(sum_of_ranks, 10)}")
        elif scenario == "big":
            result = launcher.launch(big_result)
            print(f"result numel={result.numel()} rank={int(result[0])}")
        elif scenario == "fail":
            launcher.launch(rank_one_fails)
        elif scenario == "kill":
            launcher.launch(rank_one_is_killed)
    except PeerFailedError as error:
        print(f"failed rank={error.rank} exit={error.exit_code}")
        print(f"tail={error.traceback_tail.splitlines()[-1] if error.traceback_tail else ''}")
    print(f"children left={len(multiprocessing.active_children())}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
