"""One rank counting the job-store requests of each checked collective it makes.

Run as ``store_work_job.py AGREEMENT OUT`` with ``RANK``, ``WORLD_SIZE`` and
``MASTER_PORT`` set; writes ``OUT/rank-RANK.json``: for each collective, the store
requests and keys this rank sent per call, and the same for one slow barrier (a
rank that comes after the others have waited a while).
"""

from __future__ import annotations

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.strategies.collectives import DistributedCollectives
from plait.strategies.store import STORE_PREFIX

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()

CALLS = 5
"""Calls of each collective counted through the process group."""

STORE_PATH_CALLS = ("reduce 16 floats", "barrier")
"""What the store path's runs count: its meetings delete their keys from the third
on, which torch does not let a store written in Python do."""


class CountingStore(dist.Store):
    """A store that forwards to another and counts requests and the keys they name."""

    def __init__(self, inner: dist.Store) -> None:
        super().__init__()
        self.inner = inner
        self.requests = 0
        self.keys = 0

    def _count(self, keys: int) -> None:
        self.requests += 1
        self.keys += keys

    @override
    def set(self, key: str, value: str) -> None:
        self._count(1)
        self.inner.set(key, value)

    @override
    def get(self, key: str) -> bytes:
        self._count(1)
        return self.inner.get(key)

    @override
    def add(self, key: str, value: int) -> int:
        self._count(1)
        return self.inner.add(key, value)

    @override
    def check(self, keys: list[str]) -> bool:
        self._count(len(keys))
        return self.inner.check(keys)

    @override
    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._count(len(keys))
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    # torch's stubs omit multi_set, which every Store has: no base method to name.
    def multi_set(self, keys: list[str], values: Sequence[str | bytes]) -> None:
        self._count(len(keys))
        self.inner.multi_set(keys, values)  # type: ignore[attr-defined]

    @override
    def multi_get(self, keys: list[str]) -> list[bytes]:
        self._count(len(keys))
        return self.inner.multi_get(keys)

    @override
    def num_keys(self) -> int:
        return self.inner.num_keys()


def main() -> None:
    agreement, out = sys.argv[1], Path(sys.argv[2])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    real = dist.TCPStore(
        "127.0.0.1",
        int(os.environ["MASTER_PORT"]),
        world_size,
        rank == 0,
        timeout=timedelta(seconds=60),
    )
    dist.init_process_group("gloo", store=real, rank=rank, world_size=world_size)
    store = CountingStore(real)
    collectives = DistributedCollectives(
        group=dist.new_group(backend="gloo"),
        store=store,
        rank=rank,
        world_size=world_size,
        device=torch.device("cpu"),
        timeout=timedelta(seconds=60),
        agreement=agreement,
    )
    small, large = torch.ones(16), torch.ones(1 << 16)
    calls: dict[str, Callable[[], object]] = {
        "reduce 16 floats": lambda: collectives.reduce(small, reduce_op="sum"),
        "reduce 64k floats": lambda: collectives.reduce(large, reduce_op="sum"),
        "reduce a number": lambda: collectives.reduce(1.5, reduce_op="max"),
        "broadcast a tensor": lambda: collectives.broadcast(small, src=world_size - 1),
        "broadcast an object": lambda: collectives.broadcast({"step": rank}, src=0),
        "all_gather": lambda: collectives.all_gather(small),
        "barrier": lambda: collectives.barrier("sync"),
        "reduce_boolean_decision": lambda: collectives.reduce_boolean_decision(rank == 0),
    }
    counts: dict[str, dict[str, float]] = {}
    through_backend = collectives.path == "backend"
    calls_each = CALLS if through_backend else 1
    for name, call in calls.items():
        if not through_backend and name not in STORE_PATH_CALLS:
            continue
        requests, keys = store.requests, store.keys
        for _ in range(calls_each):
            call()
        counts[name] = {
            "requests": (store.requests - requests) / calls_each,
            "keys": (store.keys - keys) / calls_each,
        }
    slow = {}
    if through_backend and world_size > 1:
        # A slow barrier: the last rank comes once rank 0 has posted where it waits.
        requests, keys = store.requests, store.keys
        if rank == world_size - 1:
            dist.PrefixStore(STORE_PREFIX, real).wait(["where/0"], timedelta(seconds=60))
        collectives.barrier("slow")
        slow = {"requests": store.requests - requests, "keys": store.keys - keys}
    result = {"path": collectives.path, "per_call": counts, "slow_barrier": slow}
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
