"""Pre-emption: a signal stops every rank at the same batch, saved, and resumable exactly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.reliability.jobs import Job, fit_command, run, torchrun_command

from plait.core.checkpoint_dirs import verify_manifest

pytestmark = pytest.mark.slow

STOPPED = 128 + signal.SIGTERM
SETTINGS = ("max_epochs=20",)
"""Long enough for the ranks' next agreement to come well before the end."""


def _uninterrupted(root: Path, strategy: str, devices: int) -> dict[str, float]:
    done = run(fit_command(strategy, devices, root, *SETTINGS), root)
    assert done.returncode == 0, done.stderr
    losses = done.seen()["losses"]
    assert isinstance(losses, dict)
    return losses


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("strategy", "devices", "signal_to"),
    [("single_device", 1, "self"), ("ddp", 2, "self"), ("ddp_spawn", 2, "parent")],
)
def test_sigterm_saves_and_the_same_command_resumes_with_the_same_losses_within_120s(
    tmp_path: Path, strategy: str, devices: int, signal_to: str
) -> None:
    stopped_root, whole_root = tmp_path / "stopped", tmp_path / "whole"
    stopped_root.mkdir()
    whole_root.mkdir()
    settings = SETTINGS
    # Rank 0 signals the process a scheduler would (its own, or the spawn launcher)
    # at step 10: the job stops soon after, at a batch every rank agrees on.
    stopped = run(
        fit_command(strategy, devices, stopped_root, *settings),
        stopped_root,
        {"SIGNAL_STEP": "10", "SIGNAL_TO": signal_to},
    )

    assert stopped.returncode == STOPPED, stopped.stderr
    assert "training stopped on SIGTERM at step" in stopped.stderr
    assert "resume with ckpt_path='last'" in stopped.stderr
    steps = [int(stopped.seen(rank)["global_step"]) for rank in range(devices)]  # type: ignore[call-overload]
    assert len(set(steps)) == 1  # every rank stopped at the same step
    assert 10 < steps[0] < 20 * 16 // devices

    resumed = run(
        fit_command(strategy, devices, stopped_root, *settings, "ckpt_path='last'"), stopped_root
    )

    assert resumed.returncode == 0, resumed.stderr
    assert resumed.seen()["losses"] == _uninterrupted(whole_root, strategy, devices)


def test_sigterm_after_a_first_call_of_the_job_stops_every_rank_at_one_step_within_60s(
    tmp_path: Path,
) -> None:
    # validate() ran first: the job's process group outlived it, and fit runs on it.
    stopped = run(
        fit_command("ddp", 2, tmp_path, *SETTINGS),
        tmp_path,
        {"SIGNAL_STEP": "10", "SIGNAL_TO": "self", "VALIDATE_FIRST": "1"},
    )

    assert stopped.returncode == STOPPED, stopped.stderr
    assert stopped.since_fault() < 60  # from the signal
    assert "training stopped on SIGTERM at step" in stopped.stderr
    steps = {int(stopped.seen(rank)["global_step"]) for rank in range(2)}  # type: ignore[call-overload]
    assert len(steps) == 1  # every rank stopped at the same step
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_sigterm_to_torchrun_stops_the_workers_gracefully_within_60s(tmp_path: Path) -> None:
    job = Job(
        torchrun_command(tmp_path, "max_epochs=50"),
        tmp_path,
        {"STALL_RANK": "0", "STALL_STEP": "4", "STALL_SECONDS": "0"},
    )
    job.wait_until((tmp_path / "stalling-0").exists, "training to reach step 4")

    job.signal(signal.SIGTERM)
    done = job.finish(60)

    assert "training stopped on SIGTERM" in done.stderr
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    steps = {done.seen(rank).get("global_step") for rank in (0, 1)}
    assert len(steps) == 1


def test_sigusr1_stops_when_asked_for(tmp_path: Path) -> None:
    done = run(
        fit_command("ddp", 2, tmp_path, "max_epochs=20", "stop_signals=['SIGUSR1']"),
        tmp_path,
        {"SIGNAL_STEP": "10", "SIGNAL": "SIGUSR1"},
    )

    assert done.returncode == 128 + signal.SIGUSR1, done.stderr
    assert "training stopped on SIGUSR1" in done.stderr


@pytest.mark.timeout(300)
def test_a_stop_on_a_loaded_machine_saves_within_slurms_kill_wait(tmp_path: Path) -> None:
    # SLURM sends SIGTERM, then SIGKILL after KillWait (30 s by default): the stop,
    # every rank's part of a sharded save included, must end within it while two
    # busy processes hold both cores.
    job = Job(fit_command("fsdp", 2, tmp_path, *SETTINGS), tmp_path, {"WIDTH": "1024"})
    job.wait_until((tmp_path / "checkpoints" / "last.ckpt" / ".metadata").exists, "a first save")
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        signalled = time.monotonic()
        job.signal(signal.SIGTERM)
        stopped = job.finish(60)
        took = time.monotonic() - signalled
    finally:
        for busy in load:
            busy.kill()
            busy.wait()

    assert stopped.returncode == STOPPED, stopped.stderr[-3000:]
    assert took < 30, f"the stop took {took:.1f} s, past SLURM's KillWait"
    assert verify_manifest(tmp_path / "checkpoints" / "last.ckpt") == []
    steps = {int(stopped.seen(rank)["global_step"]) for rank in range(2)}  # type: ignore[call-overload]
    assert len(steps) == 1  # every rank stopped at the same step
