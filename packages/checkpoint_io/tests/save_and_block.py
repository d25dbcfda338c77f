"""Child process for the kill test: starts a save that blocks halfway, then waits.

Usage: python save_and_block.py CHECKPOINT_PATH

Prints "blocked" once the save has begun writing its temporary file, then blocks
until it is killed.
"""

import sys
import threading

import torch
from typing_extensions import override

from plait.checkpoint_io import TorchCheckpointIO


class BlockDuringPickling:
    """Pickling it reports that the save is under way, then never returns."""

    @override
    def __reduce__(self) -> tuple[object, ...]:
        sys.stdout.write("blocked\n")
        sys.stdout.flush()
        threading.Event().wait()
        raise AssertionError("unreachable")


if __name__ == "__main__":
    checkpoint = {"weights": torch.full((256, 256), 2.0), "blocker": BlockDuringPickling()}
    TorchCheckpointIO().save_checkpoint(checkpoint, sys.argv[1])
