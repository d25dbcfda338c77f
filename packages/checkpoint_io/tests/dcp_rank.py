"""One rank of the two-process test of DistributedCheckpointIO on gloo.

Usage: python dcp_rank.py RANK WORLD_SIZE STORE_FILE CHECKPOINT_DIR

Saves a state with a replicated tensor and one of its own, loads both back in place
into zeroed tensors, and checks the values; changes a byte of rank 1's shard, which
every rank must refuse to load, naming the file; then saves a tensor each rank holds with
other values under one key, which every rank must refuse, naming the key and the
ranks, writing nothing. Exits non-zero on any mismatch.
"""

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from plait.checkpoint_io import DistributedCheckpointIO
from plait.core import CheckpointError

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()


def main(rank: int, world_size: int, store: str, directory: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        io = DistributedCheckpointIO()
        state = {"shared": torch.arange(6.0), f"rank{rank}": torch.full((3,), float(rank))}
        io.save_checkpoint(state, directory)
        restored = {"shared": torch.zeros(6), f"rank{rank}": torch.zeros(3)}
        io.load_checkpoint_into(directory, restored)
        assert torch.equal(restored["shared"], torch.arange(6.0)), restored
        assert torch.equal(restored[f"rank{rank}"], torch.full((3,), float(rank))), restored
        # A byte of rank 1's shard changed on disk: the ranks share the checking, and
        # every rank refuses the checkpoint, naming the file, whichever rank read it.
        dist.barrier()
        shard = Path(directory) / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        if rank == 0:
            data[-1] ^= 0x01
            shard.write_bytes(bytes(data))
        dist.barrier()
        damaged: CheckpointError | None = None
        try:
            io.load_checkpoint_into(
                directory, {"shared": torch.zeros(6), f"rank{rank}": torch.zeros(3)}
            )
        except CheckpointError as error:
            damaged = error
        assert damaged is not None, "a changed shard was loaded"
        assert "__1_0.distcp does not match its CRC-32" in str(damaged), damaged
        dist.barrier()
        if rank == 0:
            data[-1] ^= 0x01  # as it was written, for the test to read it whole
            shard.write_bytes(bytes(data))
        # One key, other values on each rank (an EMA of each rank's own): DCP would
        # write one rank's, silently. Every rank refuses, before anything is written.
        differing = {"shared": torch.arange(6.0), "extra": {"ema": torch.full((2,), rank)}}
        refused: CheckpointError | None = None
        try:
            io.save_checkpoint(differing, directory + "-differing")
        except CheckpointError as error:
            refused = error
        assert refused is not None, "ranks holding different values were saved as one"
        assert "['extra']['ema'] (rank 0 / rank 1)" in str(refused), refused
        assert "f'ema_rank{rank}'" in str(refused.fix), refused.fix
        dist.barrier()
        assert not os.path.exists(directory + "-differing")
        assert not os.path.exists(directory + "-differing.partial")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
    # Everything checked has passed and the group is destroyed. About one run in a
    # hundred, torch then aborts while the interpreter finalizes ("terminate called
    # without an active exception", after destroy_process_group returned on both
    # ranks), which would fail the test for nothing it checks: leave without
    # finalizing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
