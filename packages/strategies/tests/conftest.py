"""Starting a script as the ranks of a job on this machine, each a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from plait.core import free_port

StartRanks = Callable[..., list[str]]


@pytest.fixture
def start_ranks() -> StartRanks:
    """Run ``script ARGS`` as ``world_size`` ranks on gloo; return their outputs.

    Each rank gets ``MASTER_ADDR``/``MASTER_PORT`` (a free port), ``WORLD_SIZE``,
    ``RANK`` and ``LOCAL_RANK``, one intra-op thread, and ``environ`` on top; no
    ``SLURM_`` variable of the machine's. Every rank must exit 0 within ``timeout``
    seconds; all are killed at the end, whatever happens.
    """

    def start(
        script: Path,
        args: Sequence[str],
        world_size: int,
        *,
        environ: Mapping[str, str] | None = None,
        timeout: float = 120,
    ) -> list[str]:
        base = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
        base |= {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world_size),
            "OMP_NUM_THREADS": "1",
            **(environ or {}),
        }
        ranks = [
            subprocess.Popen(
                [sys.executable, str(script), *args],
                env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for rank in range(world_size)
        ]
        deadline = time.monotonic() + timeout
        try:
            outputs = [
                process.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
                for process in ranks
            ]
        finally:
            for process in ranks:
                process.kill()
                process.wait(timeout=30)
                if process.stdout is not None:
                    process.stdout.close()
        codes = [process.returncode for process in ranks]
        assert codes == [0] * world_size, "\n".join(
            f"--- rank {rank} exited {code}:\n{output}"
            for rank, (code, output) in enumerate(zip(codes, outputs, strict=True))
        )
        return outputs

    return start
