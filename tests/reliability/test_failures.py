"""A rank that raises, stalls or is killed: every launcher names the true cause, promptly.

Each test bounds the time from the injected fault to the job's end (its name says by
how much; `jobs.run` enforces a hard limit on the whole job on top), and checks that no
process of the job is left. The bound counts what the job waits for after the fault
(the collective timeout, the grace period, the report), not its start-up, which a
loaded machine draws out.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.reliability.jobs import (
    Finished,
    Job,
    finish_all,
    fit_command,
    run,
    torchrun_command,
)

pytestmark = pytest.mark.slow

LAUNCHERS = ["ddp", "ddp_spawn"]


AGREEMENTS = pytest.mark.parametrize("agreement", ["auto", "backend"])
"""Ranks agreeing on checked calls through the store (two ranks' ``auto``) or through
the process group (the path of large jobs)."""


@AGREEMENTS
@pytest.mark.parametrize("strategy", LAUNCHERS)
@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_that_raises_is_the_headline_within_60s(
    tmp_path: Path, strategy: str, rank: int, agreement: str
) -> None:
    done = run(
        fit_command(strategy, 2, tmp_path, "max_epochs=1"),
        tmp_path,
        {"FAIL_RANK": str(rank), "FAIL_STEP": "3", "PLAIT_CHECK_AGREEMENT": agreement},
    )

    assert done.returncode == 1
    assert done.since_fault() < 60
    cause = f"RuntimeError: injected failure on rank {rank} at step 3"
    if strategy == "ddp" and rank == 0:
        # Rank 0 is the calling process: its own error, as raised.
        assert done.headline == cause
    else:
        assert f"rank {rank} failed (exit code 1): {cause}" in done.stderr
        assert done.stderr.rstrip().endswith(cause)  # the error's own text comes last
    assert "SIGTERM" not in done.stderr  # never the launcher's own clean-up
    assert "Connection closed by peer" not in done.headline


def test_a_rank_that_raises_under_torchrun_ends_the_job_within_60s(tmp_path: Path) -> None:
    done = run(
        torchrun_command(tmp_path, "max_epochs=1"), tmp_path, {"FAIL_RANK": "1", "FAIL_STEP": "3"}
    )

    assert done.returncode != 0
    assert done.since_fault() < 60
    assert "RuntimeError: injected failure on rank 1 at step 3" in done.stderr


def _at_once(
    tmp_path: Path, command: Callable[[Path], list[str]], environments: dict[str, dict[str, str]]
) -> dict[str, Finished]:
    """Run a job for each of ``environments`` at once, each in a folder named by its key;
    how each ended. Jobs that mostly wait (for a timeout, then the grace period) share
    the time: each is bounded on its own."""
    jobs = []
    for name, environment in environments.items():
        root = tmp_path / name
        root.mkdir()
        jobs.append(Job(command(root), root, environment))
    return dict(zip(environments, finish_all(jobs), strict=True))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", LAUNCHERS)
@pytest.mark.parametrize("rank", [0, 1])
def test_a_stalled_rank_is_named_and_the_job_ends_within_60s(
    tmp_path: Path, strategy: str, rank: int
) -> None:
    # The stall lasts 600 s; the collective timeout is 5 s: shorter, and a rank that
    # is only slow on a loaded machine (two cores, every lane at once) is blamed. The
    # ranks agree on checked calls through the store (two ranks' ``auto``) in one job
    # and through the process group (the path of large jobs) in the other, at once.
    ended = _at_once(
        tmp_path,
        lambda root: fit_command(strategy, 2, root, "max_epochs=1"),
        {
            agreement: {
                "STALL_RANK": str(rank),
                "STALL_STEP": "3",
                "TIMEOUT": "5",
                "PLAIT_CHECK_AGREEMENT": agreement,
            }
            for agreement in ("auto", "backend")
        },
    )

    other = 1 - rank
    for agreement, done in ended.items():
        assert done.returncode == 1, (agreement, done.stderr[-3000:])
        assert done.since_fault() < 60, agreement
        assert (
            f"rank {rank} stalled: rank {other} timed out after 5 s waiting for it in a collective"
            in done.headline
        ), (agreement, done.stderr[-3000:])


@pytest.mark.timeout(300)
def test_a_rank_stalling_after_a_first_call_of_the_job_is_named_within_60s(
    tmp_path: Path,
) -> None:
    # validate() ran first: the job's process group outlived it, and fit runs on it.
    # Rank 0 stalls in one job, rank 1 in the other, at once.
    ended = _at_once(
        tmp_path,
        lambda root: fit_command("ddp", 2, root, "max_epochs=1"),
        {
            str(rank): {
                "STALL_RANK": str(rank),
                "STALL_STEP": "3",
                "TIMEOUT": "5",
                "VALIDATE_FIRST": "1",
            }
            for rank in (0, 1)
        },
    )

    for name, done in ended.items():
        rank = int(name)
        assert done.returncode == 1, done.stderr[-3000:]
        assert done.since_fault() < 60, rank
        assert (
            f"rank {rank} stalled: rank {1 - rank} timed out after 5 s waiting for it "
            "in a collective" in done.headline
        ), done.stderr[-3000:]


def test_a_stalled_rank_under_torchrun_is_named_by_the_rank_that_waited_within_60s(
    tmp_path: Path,
) -> None:
    # torchrun answers rank 0's failure with SIGTERM to rank 1, asleep in the user's
    # code: stop_timeout bounds its graceful stop (3 s) where torchrun would wait 30 s.
    done = run(
        torchrun_command(tmp_path, "max_epochs=1", "stop_timeout=3"),
        tmp_path,
        {"STALL_RANK": "1", "STALL_STEP": "3", "TIMEOUT": "5"},
    )

    assert done.returncode != 0
    assert done.since_fault() < 60
    assert "collective timed out after 5 s: ranks 1 did not arrive (arrived: 0)" in done.stderr


@pytest.mark.parametrize("strategy", LAUNCHERS)
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_launcher_leaves_no_rank_behind_within_60s(
    tmp_path: Path, strategy: str, signum: signal.Signals
) -> None:
    # The launcher: rank 0 under ddp (popen), the calling process under ddp_spawn.
    job = Job(
        fit_command(strategy, 2, tmp_path, "max_epochs=1"),
        tmp_path,
        # A timeout of 5 s: a rank merely slow on a loaded machine before its stall
        # is not taken for it.
        {"STALL_RANK": "1", "STALL_STEP": "3", "TIMEOUT": "5"},
    )
    job.wait_until((tmp_path / "stalling-1").exists, "rank 1 to stall")

    job.signal(signum)
    done = job.finish(60)  # fails if rank 1 (or anything else) is left running

    assert done.returncode != 0
    # Rank 1 writes to the terminal itself: its output is not lost with rank 0.
    assert "rank 1 stalls at step 3" in done.stderr
    if signum == signal.SIGTERM:
        # A graceful stop was asked for; rank 1 could not take part: it is named.
        assert "rank 1 stalled" in done.stderr


@pytest.mark.timeout(400)
def test_a_stalled_rank_0_under_popen_is_named_every_time_within_60s_each(
    tmp_path: Path,
) -> None:
    # Rank 0 is the calling process, asleep in the user's code: the hardest to stop.
    # The attempts run at once (each mostly waits: for the timeout, then the grace
    # period), each bounded on its own.
    jobs = []
    for attempt in range(3):
        root = tmp_path / str(attempt)
        root.mkdir()
        jobs.append(
            Job(
                fit_command("ddp", 2, root, "max_epochs=1"),
                root,
                # Three jobs of two ranks at once: a timeout of 5 s, so that a rank
                # merely slow on a loaded machine before its stall is not taken for it.
                {"STALL_RANK": "0", "STALL_STEP": str(2 + attempt), "TIMEOUT": "5"},
            )
        )
    for attempt, done in enumerate(finish_all(jobs)):
        assert done.returncode == 1
        assert done.since_fault() < 60, f"attempt {attempt} took {done.since_fault():.1f} s"
        assert "rank 0 stalled: rank 1 timed out after 5 s" in done.headline, done.stderr[-3000:]


def test_a_stalled_rank_0_that_no_signal_reaches_is_shown_where_it_was_then_named(
    tmp_path: Path,
) -> None:
    # Rank 0 stalls with SIGINT blocked (stuck in a C call): the launcher's interrupt
    # cannot stop it, so after the grace period it prints where rank 0 was and ends
    # the job; the cause is still the last line.
    done = run(
        fit_command("ddp", 2, tmp_path, "max_epochs=1"),
        tmp_path,
        {"STALL_RANK": "0", "STALL_STEP": "3", "TIMEOUT": "5", "STALL_MASKED": "1"},
    )

    assert done.returncode == 1, done.stderr[-3000:]
    assert done.since_fault() < 60
    assert "rank 0 stalled: rank 1 timed out after 5 s" in done.headline, done.stderr[-3000:]
    _, _, cause = done.stderr.partition("plait: rank 0 did not stop within 5 s")
    assert cause, done.stderr[-3000:]
    assert "of being interrupted; it was at:" in cause
    assert "in _inject" in cause  # the stall's frame, in the user's training_step
    assert "time.sleep(" in cause


@pytest.mark.timeout(400)
def test_spawn_failures_of_rank_0_blame_rank_0_every_time_within_45s_each(tmp_path: Path) -> None:
    for pair in ((0, 1), (2, 3)):  # two at a time, each bounded on its own
        jobs = []
        for attempt in pair:
            root = tmp_path / str(attempt)
            root.mkdir()
            jobs.append(
                Job(
                    fit_command("ddp_spawn", 2, root, "max_epochs=1"),
                    root,
                    {"FAIL_RANK": "0", "FAIL_STEP": str(2 + attempt)},
                )
            )
        for attempt, done in zip(pair, finish_all(jobs), strict=True):
            assert done.returncode == 1
            assert done.since_fault() < 45, f"attempt {attempt}: {done.since_fault():.1f} s"
            assert "rank 0 failed (exit code 1): RuntimeError: injected failure" in done.stderr
