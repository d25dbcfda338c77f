"""A program that launches ranks, for the launcher tests.

Usage: python launch_main.py SCENARIO START_METHOD NUM_PROCESSES
       python launch_main.py strategy|strategy_fail|strategy_abort REGISTERED_NAME NUM_PROCESSES

Prints what the launcher returned or raised, and how many child processes are left.
"""

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from datetime import timedelta

import torch

from plait.core import PeerFailedError, StrategyRegistry
from plait.strategies import DDPStrategy
from plait.strategies.launchers import MultiprocessingLauncher

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()


def joined() -> DDPStrategy:
    strategy = DDPStrategy(accelerator="cpu", timeout=timedelta(seconds=60))
    strategy.setup_environment()
    return strategy


def sum_of_ranks(offset: int) -> int:
    strategy = joined()
    try:
        return int(strategy.reduce(strategy.global_rank + offset, reduce_op="sum"))
    finally:
        strategy.teardown()


def threads() -> int:
    # Native threads too (a store's server thread is not Python's).
    return len(os.listdir("/proc/self/task"))


def big_result() -> torch.Tensor:
    # Far larger than a pipe's buffer: the launcher must read it while rank 0 sends.
    return torch.full((1 << 20,), float(os.environ["RANK"]))


def sum_of_big_work(work: torch.Tensor) -> int:
    # ``work`` is far larger than a pipe's buffer: every rank must receive it whole.
    strategy = joined()
    try:
        return int(strategy.reduce(int(work.sum()), reduce_op="sum"))
    finally:
        strategy.teardown()


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


def deaf_to_sigterm(ready: str) -> None:
    # As a rank stuck in native code is (a deadlock in OpenMP after a fork): it never
    # runs a Python signal handler, so no stop signal reaches it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(ready, os.environ["RANK"]), "w"):
        pass
    time.sleep(600)


def signal_once_ranks_are_ready(ready: str, num_processes: int) -> None:
    def wait_then_signal() -> None:
        while len(os.listdir(ready)) < num_processes:
            time.sleep(0.05)  # polls what the ranks wrote: no stand-in for a wait
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait_then_signal, daemon=True).start()


def abort_in_native_code() -> None:
    # As a C++ std::terminate does: SIGABRT, with no Python exception to report.
    os.abort()


def place_and_sum(
    strategy: DDPStrategy, fail_on: int | None, abort: bool = False
) -> tuple[int, int, int]:
    # The strategy arrives in each rank made anew, knowing that rank's place.
    strategy.setup_environment()
    try:
        if strategy.global_rank == fail_on and abort:
            abort_in_native_code()
        if strategy.global_rank == fail_on:
            raise ValueError(f"boom on rank {fail_on}")
        total = int(strategy.reduce(strategy.global_rank, reduce_op="sum"))
        return strategy.global_rank, strategy.world_size, total
    except PeerFailedError as failure:
        print(f"rank {strategy.global_rank} saw rank {failure.rank} fail", flush=True)
        raise
    finally:
        strategy.teardown()


def main(scenario: str, start_method: str, num_processes: int) -> None:
    try:
        if scenario.startswith("strategy"):
            strategy = StrategyRegistry.get(
                start_method,  # here, a registered name
                accelerator="cpu",
                parallel_devices=[torch.device("cpu")] * num_processes,
                timeout=timedelta(seconds=60),
            )
            assert isinstance(strategy, DDPStrategy)
            fail_on = 1 if scenario in ("strategy_fail", "strategy_abort") else None
            abort = scenario == "strategy_abort"
            placed = strategy.launcher.launch(place_and_sum, strategy, fail_on, abort)
            print(f"result={placed}")
            return
        launcher = MultiprocessingLauncher(num_processes, start_method=start_method)
        if scenario == "sum":
            print(f"result={launcher.launch(sum_of_ranks, 10)}")
        elif scenario == "threads":
            # How many threads this process runs at each fork, and before the launch.
            forks: list[int] = []
            os.register_at_fork(before=lambda: forks.append(threads()))
            before = threads()
            print(f"result={launcher.launch(sum_of_ranks, 10)}")
            print(f"threads before={before} at forks={forks}")
        elif scenario == "big":
            result = launcher.launch(big_result)
            print(f"result numel={result.numel()} rank={int(result[0])}")
        elif scenario == "bigwork":
            print(
                f"result={launcher.launch(sum_of_big_work, torch.ones(1 << 20, dtype=torch.int64))}"
            )
        elif scenario == "fail":
            launcher.launch(rank_one_fails)
        elif scenario == "kill":
            launcher.launch(rank_one_is_killed)
        elif scenario == "deaf":
            launcher = MultiprocessingLauncher(
                num_processes, start_method=start_method, grace_period=1, stop_timeout=1
            )
            ready = tempfile.mkdtemp()
            signal_once_ranks_are_ready(ready, num_processes)
            started = time.monotonic()
            try:
                launcher.launch(deaf_to_sigterm, ready)
            finally:
                print(f"ended after {time.monotonic() - started:.0f} s")
    except PeerFailedError as error:
        print(f"failed rank={error.rank} exit={error.exit_code}")
        print(f"tail={error.traceback_tail.splitlines()[-1] if error.traceback_tail else ''}")
    finally:
        print(f"children left={len(multiprocessing.active_children())}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
