"""What checked collectives cost as the ranks grow: the workloads of ``tools/bench scale``.

    python tools/bench_scale.py ranks --world-size 8 --rounds 3 --out ranks.json
    python tools/bench_scale.py store --world-sizes 2,64,1024 --out store.json

``ranks`` starts ``--world-size`` gloo processes on this machine; each times, per
call, raw torch.distributed against plait's collectives unchecked, checked through
the job's store (``store``) and checked through the process group (``backend``), for
a reduce of 16 and of 1M floats, a broadcast of 16 floats and a barrier. Rank 0
writes each side's seconds per call, one figure per round (the sides take turns).

``store`` measures the job store's work for one checked collective at each world
size, as rank 0's store serves it: the requests and keys every rank sends and the
bytes it reads back, and the time one client takes to send all of them to a real
TCPStore, one after another. The store path's requests are those `Rendezvous.meet`
makes (post the call, wait for every rank's key, read every rank's call, delete an
old key); the process-group path makes none on its fast path (counted by
``packages/strategies/tests/test_store_work.py``), and two per waiting rank when a
call waits longer than `POST_AFTER`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Final

CASES: Final = ("reduce 16 floats", "reduce 1M floats", "broadcast 16 floats", "barrier")
SIDES: Final = ("raw", "unchecked", "store", "backend")


def _rank(rank: int, world_size: int, port: int, rounds: int, out: str) -> None:
    import torch  # noqa: PLC0415 - in the rank process only
    import torch.distributed as dist  # noqa: PLC0415

    from plait.strategies.collectives import DistributedCollectives  # noqa: PLC0415

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, rank == 0, timeout=timedelta(minutes=5))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(minutes=5)
    )
    group = dist.new_group(backend="gloo")

    def side(name: str, *, checked: bool, agreement: str) -> DistributedCollectives:
        return DistributedCollectives(
            group=group,
            store=dist.PrefixStore(f"bench-{name}/", store),
            rank=rank,
            world_size=world_size,
            device=torch.device("cpu"),
            checked=checked,
            timeout=timedelta(minutes=5),
            agreement=agreement,
        )

    sides = {
        "unchecked": side("unchecked", checked=False, agreement="auto"),
        "store": side("store", checked=True, agreement="store"),
        "backend": side("backend", checked=True, agreement="backend"),
    }
    small, large = torch.ones(16), torch.ones(1_000_000)

    def raw_reduce(tensor: torch.Tensor) -> Callable[[], object]:
        def run() -> object:
            out = tensor.clone()
            dist.all_reduce(out, group=group)
            return out

        return run

    calls: dict[str, dict[str, Callable[[], object]]] = {
        "reduce 16 floats": {"raw": raw_reduce(small)},
        "reduce 1M floats": {"raw": raw_reduce(large)},
        "broadcast 16 floats": {"raw": lambda: dist.broadcast(small.clone(), 0, group=group)},
        "barrier": {"raw": lambda: dist.barrier(group=group)},
    }

    def plait_calls(c: DistributedCollectives) -> dict[str, Callable[[], object]]:
        return {
            "reduce 16 floats": lambda: c.reduce(small, reduce_op="sum"),
            "reduce 1M floats": lambda: c.reduce(large, reduce_op="sum"),
            "broadcast 16 floats": lambda: c.broadcast(small, src=0),
            "barrier": c.barrier,
        }

    for name, collectives in sides.items():
        for case, action in plait_calls(collectives).items():
            calls[case][name] = action
    repeats = {"reduce 1M floats": 4}
    results: dict[str, dict[str, list[float]]] = {case: {s: [] for s in SIDES} for case in CASES}
    for index in range(rounds + 1):  # the first round warms up and is dropped
        for case in CASES:
            order = list(calls[case].items())
            shift = index % len(order)  # each round, another side goes first
            for name, action in [*order[shift:], *order[:shift]]:
                repeat = repeats.get(case, 40)
                dist.barrier(group=group)
                start = time.perf_counter()
                for _ in range(repeat):
                    action()
                seconds = (time.perf_counter() - start) / repeat
                if index:
                    results[case][name].append(seconds)
    if rank == 0:
        paths = {name: collectives.path for name, collectives in sides.items()}
        Path(out).write_text(json.dumps({"seconds": results, "paths": paths}), encoding="utf-8")
    dist.barrier(group=group)
    dist.destroy_process_group()


def run_ranks(world_size: int, rounds: int, out: Path) -> None:
    """Start ``world_size`` ranks of `_rank` and wait for them."""
    from plait.core.network import free_port  # noqa: PLC0415

    context = multiprocessing.get_context("spawn")
    port = free_port()
    processes = [
        context.Process(target=_rank, args=(rank, world_size, port, rounds, str(out)))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    try:
        for process in processes:
            process.join(timeout=600)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    codes = [process.exitcode for process in processes]
    if any(codes):
        raise RuntimeError(f"the ranks exited with {codes}")


def _posted_call(world_size: int) -> bytes:
    # What a rank posts for a checked reduce of 16 floats: the call, and the values
    # when every rank's fit in the meeting.
    import torch  # noqa: PLC0415

    from plait.core import CollectiveCall  # noqa: PLC0415
    from plait.strategies.collectives import wire  # noqa: PLC0415

    params = {"op": "sum", "kind": "tensor", "shape": (16,), "dtype": torch.float32}
    call = CollectiveCall("reduce", params)
    values = torch.ones(16)
    inline = values.numel() * values.element_size() * world_size <= wire.INLINE_ALL_BYTES
    note = wire.tensor_bytes(values) if inline else b""
    return json.dumps([call.collective, call.params]).encode() + b"\n" + note


def store_work(world_size: int) -> dict[str, dict[str, float]]:
    """One checked collective's store work at ``world_size`` ranks, on each path."""
    import torch.distributed as dist  # noqa: PLC0415

    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=60))
    store = dist.PrefixStore("plait/collectives", server)
    ranks = range(world_size)
    entry = _posted_call(world_size)
    # The meeting before, whose keys the ranks delete, and this one's.
    store.multi_set([f"1/{rank}" for rank in ranks], [entry] * world_size)  # type: ignore[attr-defined]
    keys = [f"2/{rank}" for rank in ranks]
    start = time.perf_counter()
    for rank in ranks:  # every rank posts its call and where it is
        store.multi_set([f"2/{rank}", f"at/{rank}"], [entry, b"2"])  # type: ignore[attr-defined]
    for _ in ranks:  # every rank waits for every rank's key, then reads them all
        store.wait(keys, timedelta(seconds=60))
        store.multi_get(keys)
    for rank in ranks:
        store.delete_key(f"1/{rank}")
    seconds = time.perf_counter() - start
    per_rank = {"requests": 4.0, "keys": 2.0 + 2 * world_size + 1}
    return {
        "store": {
            **per_rank,
            "bytes read": float(world_size * len(entry)),
            "total requests": per_rank["requests"] * world_size,
            "total keys": per_rank["keys"] * world_size,
            "total bytes read": float(world_size * world_size * len(entry)),
            "seconds": seconds,
        },
        "backend": {
            "requests": 0.0,
            "keys": 0.0,
            "bytes read": 0.0,
            "total requests": 0.0,
            "total keys": 0.0,
            "total bytes read": 0.0,
            "seconds": 0.0,
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Run one workload and write its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ranks = commands.add_parser("ranks", help="time the collectives in real gloo ranks")
    ranks.add_argument("--world-size", type=int, required=True)
    ranks.add_argument("--rounds", type=int, default=3)
    ranks.add_argument("--out", type=Path, required=True)
    store = commands.add_parser("store", help="count and time one collective's store work")
    store.add_argument("--world-sizes", default="2,4,8,16,64,256,1024")
    store.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "ranks":
        if args.world_size < 2 or args.rounds < 1:
            parser.error("--world-size must be 2 or more and --rounds 1 or more")
        run_ranks(args.world_size, args.rounds, args.out)
        return 0
    try:
        sizes = [int(size) for size in args.world_sizes.split(",")]
    except ValueError:
        parser.error(f"--world-sizes={args.world_sizes!r}: give numbers, e.g. 2,64,1024")
    if any(size < 1 for size in sizes):
        parser.error(f"--world-sizes={args.world_sizes!r}: each must be 1 or more")
    store_work(2)  # untimed: the first requests of a process set things up
    figures = {str(size): store_work(size) for size in sizes}
    args.out.write_text(json.dumps(figures), encoding="utf-8")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
