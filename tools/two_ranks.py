"""Two gloo ranks for a benchmark: started, timed side by side, and their figures written.

Used by ``bench_context.py`` and ``bench_pipeline.py``: `start` runs a function in
two processes (torchrun's environment, a free port; spawned, or forked where
`start_method` says) and fails if either does; `time_sides` times each side's step
over rounds, the sides taking turns. The other tools start their ranks as
`start_method` says, too.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

START_METHOD: Final = "PLAIT_BENCH_START_METHOD"
"""The variable that says how the benchmarks start their ranks (`start_method`)."""


def start_method() -> str:
    """How a benchmark starts its ranks: ``spawn`` unless ``$PLAIT_BENCH_START_METHOD`` says.

    ``spawn``: each rank a new interpreter, as the figures are measured. ``fork``: each
    a fork of the tool's process, which has imported torch already (``bench.py
    --smoke``, whose figures are not read, runs every section so): the ranks run the
    same code and skip the second of CPU each spends importing torch again.
    """
    method = os.environ.get(START_METHOD, "spawn")
    if method not in ("spawn", "fork"):
        raise SystemExit(f"{START_METHOD}={method!r}: choose spawn or fork")
    return method


def process_context() -> multiprocessing.context.ForkContext | multiprocessing.context.SpawnContext:
    """The multiprocessing context of `start_method`."""
    if start_method() == "fork":
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def join_as(rank: int, port: int) -> None:
    """Describe a job of 2 ranks to this process as torchrun would, as ``rank``."""
    os.environ.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
        "TORCHELASTIC_RUN_ID": "plait-bench", "PLAIT_CLUSTER_ENVIRONMENT": "torchelastic",
    })  # fmt: skip


def time_sides(
    sides: Mapping[str, Callable[[], object]],
    *,
    rounds: int,
    steps: int,
    barrier: Callable[[], object],
) -> dict[str, list[float]]:
    """Seconds per step of each side, a list over ``rounds`` (after one warm-up round).

    Each round another side goes first; the ranks meet at ``barrier`` before each
    side's steps, and no garbage collection runs inside a timing.
    """
    results: dict[str, list[float]] = {name: [] for name in sides}
    gc.collect()
    gc.disable()
    try:
        for index in range(rounds + 1):
            order = list(sides.items())
            shift = index % len(order)
            for name, side in [*order[shift:], *order[:shift]]:
                barrier()
                start = time.perf_counter()
                for _ in range(steps):
                    side()
                seconds = (time.perf_counter() - start) / steps
                if index:
                    results[name].append(seconds)
    finally:
        gc.enable()
    return results


def write(rank: int, out: Path, results: Mapping[str, list[float]]) -> None:
    """Rank 0 writes the figures to ``out``."""
    if rank == 0:
        out.write_text(json.dumps(results), encoding="utf-8")


def start(
    target: Callable[[int, int, argparse.Namespace], None], args: argparse.Namespace, what: str
) -> None:
    """Run ``target(rank, port, args)`` in two processes (`start_method`); fail if either does."""
    from plait.core.network import free_port  # noqa: PLC0415

    port = free_port()
    context = process_context()
    ranks = [context.Process(target=target, args=(rank, port, args)) for rank in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    codes = [process.exitcode for process in ranks]
    if any(codes):
        raise SystemExit(f"the {what} ranks exited with {codes}")
