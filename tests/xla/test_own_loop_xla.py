"""The loop of a team's own (``tests/own_loop_job.py``) on XLA, unchanged but for its strategy.

On one XLA:CPU device, ``single_xla`` and ``xla`` run the very run the CPU runs,
resume it exactly, accumulate with ``no_sync`` as one batch of twice the size,
export one plain file, and take a checkpoint to and from one CPU device with the
optimizer's state.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.test_own_loop import run_and_check

pytestmark = pytest.mark.slow


def test_the_same_loop_runs_resumes_and_moves_on_xla(tmp_path: Path) -> None:
    environ = {
        **os.environ,
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    run_and_check(
        tmp_path,
        ("single_device", "single_xla", "xla"),
        ("single_device:single_xla", "single_xla:single_device", "xla:single_device"),
        env=environ,
    )
