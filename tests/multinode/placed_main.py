"""One rank of a multi-host job: joins it, and rank 0 prints where every rank is.

Run under torchrun. Each rank reports its ranks as plait's strategy sees them and
the network namespace it runs in (its inode); rank 0 prints all of them, gathered
across the hosts, as one JSON line: ``placed: [...]``.
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

from plait.strategies import DDPStrategy

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()

if __name__ == "__main__":
    strategy = DDPStrategy(accelerator="cpu", timeout=timedelta(seconds=60))
    strategy.setup_environment()
    try:
        mine = torch.tensor(
            [
                strategy.global_rank,
                strategy.local_rank,
                strategy.cluster_environment.node_rank,
                strategy.world_size,
                os.stat("/proc/self/ns/net").st_ino,
            ]
        )
        everyone = strategy.all_gather(mine).tolist()
        if strategy.global_rank == 0:
            fields = ("global_rank", "local_rank", "node_rank", "world_size", "network")
            rows = [dict(zip(fields, row, strict=True)) for row in everyone]
            sys.stdout.write(f"placed: {json.dumps(rows)}\n")
    finally:
        strategy.teardown()
