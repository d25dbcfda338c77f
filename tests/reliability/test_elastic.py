"""torchrun restarts a failed job: the restarted ranks start cleanly and finish the work."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from tests.processes import processes_mentioning
from tests.reliability.jobs import Job, finish_all, torchrun_command, wait_for

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_a_restart_after_a_failure_finishes_every_time_within_90s_each(tmp_path: Path) -> None:
    # A failure in the first epoch and in the second, on either rank, twice each:
    # the restarted attempt resumes from last.ckpt and completes.
    # Two jobs at a time, each bounded on its own.
    cases = [(1, 5), (0, 12), (0, 5), (1, 12)]
    for pair in (cases[:2], cases[2:]):
        jobs = []
        for rank, step in pair:
            root = tmp_path / f"{rank}-{step}"
            root.mkdir()
            failing = {"FAIL_RANK": str(rank), "FAIL_STEP": str(step)}
            jobs.append(
                Job(
                    torchrun_command(root, "max_epochs=2", "ckpt_path='last'", restarts=1),
                    root,
                    {**failing, "FAIL_ONCE": str(root / "failed")},
                )
            )
        for (rank, step), done in zip(pair, finish_all(jobs, timeout=90), strict=True):
            assert done.returncode == 0, f"rank {rank}, step {step}: {done.stderr[-3000:]}"
            assert (done.root / "failed").exists()  # it did fail once
            assert done.result() == {"global_step": 16, "epoch": 2}
            assert done.checkpoints() == ["epoch=1-step=16.ckpt", "last.ckpt"]


def test_workers_die_with_a_killed_torchrun_within_30s(tmp_path: Path) -> None:
    job = Job(
        torchrun_command(tmp_path, "max_epochs=1"),
        tmp_path,
        {"STALL_RANK": "1", "STALL_STEP": "2"},
    )
    job.wait_until((tmp_path / "stalling-1").exists, "rank 1 to stall")

    job.signal(signal.SIGKILL)  # torchrun can run no clean-up

    # Its workers run in sessions of their own; they must not outlive it.
    wait_for(lambda: not processes_mentioning(str(tmp_path)), 30, "the workers to exit")
    job.finish(10)


def test_a_rank_asleep_when_another_fails_ends_within_its_stop_timeout_under_torchrun(
    tmp_path: Path,
) -> None:
    # torchrun answers rank 1's failure with SIGTERM to rank 0, asleep in the user's
    # code: a graceful stop that no batch will act on. Unbounded, torchrun waited its
    # 30 s before SIGKILL; rank 0 now ends itself after stop_timeout (3 s here).
    job = Job(
        torchrun_command(tmp_path, "max_epochs=2", "stop_timeout=3"),
        tmp_path,
        {"FAIL_RANK": "1", "FAIL_STEP": "5", "STALL_RANK": "0", "STALL_STEP": "5"},
    )
    job.wait_until((tmp_path / "stalling-0").exists, "rank 0 to fall asleep")
    asleep = time.monotonic()

    done = job.finish(60)

    assert done.returncode != 0
    assert "did not end within 3 s (stop_timeout)" in done.stderr, done.stderr[-3000:]
    assert "in _inject" in done.stderr  # where rank 0's main thread was
    assert "injected failure on rank 1" in done.stderr
    assert time.monotonic() - asleep < 25, "torchrun waited for its own SIGKILL"
