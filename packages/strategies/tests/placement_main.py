"""One rank of the start-up layout tests: join the job, or print why it was refused.

Usage: RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... python placement_main.py

``HOST_NAME`` stands for the host name this rank reports, as a rank on another
machine would (the test runs every rank on one).
"""

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import os
import socket
from datetime import timedelta

from plait.core import ConfigurationError
from plait.strategies import DDPStrategy

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()

if __name__ == "__main__":
    if "HOST_NAME" in os.environ:
        socket.gethostname = lambda: os.environ["HOST_NAME"]
    strategy = DDPStrategy(accelerator="cpu", timeout=timedelta(seconds=60))
    try:
        strategy.setup_environment()
        total = strategy.reduce(strategy.global_rank, reduce_op="sum")
        print(f"rank {strategy.global_rank} joined; the ranks sum to {total}")
    except ConfigurationError as error:
        print(f"refused: {error}")
    finally:
        strategy.teardown()
