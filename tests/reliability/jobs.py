"""Running a user's training job in new processes, and checking what it left behind.

Every job runs in a session of its own, bounded by a timeout; afterwards no process
of it may remain, whether in its session or (torchrun's workers have sessions of
their own) anywhere with the job's directory on its command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
from tests import warm
from tests.processes import processes_in_session, processes_mentioning

SCRIPT = Path(__file__).resolve().parent / "fit_script.py"
TORCHRUN = Path(__file__).resolve().parent.parent / "torchrun.py"
"""torchrun's command, its import paused for the cycle collector (see the script)."""
LAUNCH_TIMEOUT = 150.0
"""No job of these tests may take longer, whatever it does: a hang fails, it never blocks."""

LONG_JOB_TIMEOUT = 2 * LAUNCH_TIMEOUT
"""The bound of the jobs that took past `LAUNCH_TIMEOUT` with a second whole check beside
them on two cores (30 to 80 s alone): DeepSpeed's ZeRO-3 resume runs, and torchrun's
elastic restarts across two hosts."""


@attrs.frozen
class Finished:
    """How a job ended, as its user saw it."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    root: Path
    ended: float = attrs.field(factory=time.time)
    """When the job's last process ended (the clock's time)."""

    def since_fault(self) -> float:
        """Seconds from the injected fault (``fault``, written by the rank) to the job's end.

        A bound on this counts what the test waits for (the timeout, the grace period,
        the report), not the job's start-up, which a loaded machine draws out.
        """
        return self.ended - float((self.root / "fault").read_text())

    @property
    def headline(self) -> str:
        """The last error line of the output: the error the user reads first."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        for line in reversed(lines):
            text = line.split("]: ", 1)[-1] if line.startswith("[rank") else line
            if text.startswith(("plait.core.errors.", "plait:", "RuntimeError", "plait.")):
                return text
        return lines[-1] if lines else ""

    def result(self) -> dict[str, object]:
        """What rank 0 wrote at the end of a finished fit (empty if it did not finish)."""
        path = self.root / "result.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def seen(self, rank: int = 0) -> dict[str, object]:
        """What ``rank`` saw: its losses by step, and where it stopped."""
        path = self.root / f"seen-{rank}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def checkpoints(self) -> list[str]:
        """Every file in the checkpoint directory, hidden ones too, sorted."""
        folder = self.root / "checkpoints"
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def fit_command(strategy: str, devices: int, root: Path, *settings: str) -> list[str]:
    """The command line of the user's script."""
    return [
        sys.executable,
        str(SCRIPT),
        strategy,
        str(devices),
        f"default_root_dir={str(root)!r}",
        *settings,
    ]


def torchrun_command(root: Path, *settings: str, restarts: int = 0) -> list[str]:
    """The user's script under torchrun, two processes on this machine."""
    return [
        sys.executable,
        str(TORCHRUN),
        "--standalone",
        "--nproc-per-node=2",
        f"--max-restarts={restarts}",
        "--monitor-interval=0.1",
        *fit_command("ddp", 2, root, *settings)[1:],
    ]


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.02
) -> None:
    """Wait until ``predicate()`` holds (checked every ``interval`` s), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def _kill_everything(session: int, marker: str) -> None:
    for pid in {*processes_in_session(session), *processes_mentioning(marker)}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class WarmScript:
    """The user's script run warm (`tests.warm`), seen as the `subprocess.Popen` a `Job`
    uses: its id, its signals, its end and its output."""

    def __init__(self, command: Sequence[str], environ: Mapping[str, str], cwd: Path) -> None:
        self.args = list(command)
        self._process = warm.WarmProcess(
            Path(command[1]), command[2:], environ, cwd=cwd, new_session=True,
            separate_errors=True,
        )  # fmt: skip
        self.pid = self._process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        self.returncode = self._process.returncode
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to it, if it still runs."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for its end (at most ``timeout`` seconds); its output and errors.

        Raises:
            subprocess.TimeoutExpired: It still runs after ``timeout`` seconds.
        """
        if self._process.wait(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.returncode = self._process.returncode
        written = self._process.output(), self._process.errors()
        self._process.close()  # its files removed, its CPU time counted
        return written


class Job:
    """A job started in a session of its own, with its output captured.

    The user's script (`SCRIPT`) runs warm (`tests.warm`): a process forked from one
    that imported torch and plait, since what these tests check is what a job does when
    a rank fails, stalls or is stopped, not how an interpreter starts; the ranks its
    launcher starts (``ddp``'s new interpreters, ``ddp_spawn``'s spawned ones) are
    started as they always are. Any other command (torchrun) starts anew.
    """

    def __init__(
        self, command: Sequence[str], root: Path, environment: Mapping[str, str] | None = None
    ) -> None:
        self.root = root
        self.started = time.monotonic()
        env = {**os.environ, **(environment or {})}
        env.pop("PLAIT_LAUNCHED", None)
        self.process: subprocess.Popen[str] | WarmScript
        if list(command[:2]) == [sys.executable, str(SCRIPT)]:
            self.process = WarmScript(command, env, root)
        else:
            self.process = subprocess.Popen(
                list(command),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=root,
                start_new_session=True,
            )

    def wait_until(
        self, predicate: Callable[[], bool], what: str, timeout: float = LAUNCH_TIMEOUT
    ) -> None:
        """Wait until ``predicate()`` holds while the job runs: the job's progress.

        Bounded as a launch is (a loaded machine starts ranks slowly): the bound a
        test checks comes after, on what the job does next.

        Raises:
            AssertionError: The job ended first (with its output: the cause), or
                ``timeout`` passed (the job is killed, its output shown).
        """
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.process.poll() is not None:
                done = self.wait(10)
                raise AssertionError(
                    f"the job ended (status {done.returncode}) before {what}:\n"
                    f"{done.stderr[-4000:]}"
                )
            if time.monotonic() > deadline:
                _kill_everything(self.process.pid, str(self.root))
                _, stderr = self.process.communicate()
                raise AssertionError(
                    f"timed out after {timeout:g} s waiting for {what}:\n{stderr[-4000:]}"
                )
            time.sleep(0.02)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the job's first process (the launcher, or rank 0)."""
        self.process.send_signal(signum)

    def finish(self, timeout: float = LAUNCH_TIMEOUT) -> Finished:
        """Wait for the job, then check that none of its processes is left.

        Raises:
            AssertionError: It outlived ``timeout`` (it is killed) or left a process.
        """
        done = self.wait(timeout)
        self.check_nothing_left(done)
        return done

    def wait(self, timeout: float = LAUNCH_TIMEOUT) -> Finished:
        """Wait for the job's first process to end; its outcome.

        Raises:
            AssertionError: It outlived ``timeout`` (it is killed).
        """
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_everything(self.process.pid, str(self.root))
            stdout, stderr = self.process.communicate()
            raise AssertionError(
                f"the job did not end within {timeout:g} s:\n{stderr[-4000:]}"
            ) from None
        seconds = time.monotonic() - self.started
        code = self.process.returncode
        assert code is not None  # it has ended
        return Finished(code, stdout, stderr, seconds, self.root, time.time())

    def check_nothing_left(self, done: Finished) -> None:
        """Check that the job's processes (its session's, and any naming its folder) exit.

        Raises:
            AssertionError: One is still there 10 s on (all are killed).
        """
        session = self.process.pid  # the session's leader: its id is the session's
        try:
            wait_for(
                lambda: (
                    not processes_in_session(session) and not processes_mentioning(str(self.root))
                ),
                10,
                "the job's processes to exit",
            )
        except AssertionError:
            left = sorted({*processes_in_session(session), *processes_mentioning(str(self.root))})
            _kill_everything(session, str(self.root))
            raise AssertionError(
                f"the job left processes behind: {left}\n{done.stderr[-4000:]}"
            ) from None


def run(
    command: Sequence[str],
    root: Path,
    environment: Mapping[str, str] | None = None,
    timeout: float = LAUNCH_TIMEOUT,
) -> Finished:
    """Run a job to its end (see `Job.finish`)."""
    return Job(command, root, environment).finish(timeout)


def finish_all(jobs: Sequence[Job], timeout: float = LAUNCH_TIMEOUT) -> list[Finished]:
    """Finish every job of ``jobs`` (started at once), even after one failed; their ends.

    Raises:
        AssertionError: The first job that failed to end well (see `Job.finish`).
    """
    waited: list[tuple[Job, Finished]] = []
    failures: list[AssertionError] = []
    for job in jobs:
        try:
            waited.append((job, job.wait(timeout)))
        except AssertionError as failure:  # noqa: PERF203 (each job must be finished)
            failures.append(failure)
    # Jobs may share a folder (the hosts of one job): a process naming it is left
    # behind only once every job's first process has ended, not while another runs.
    for job, done in waited:
        try:
            job.check_nothing_left(done)
        except AssertionError as failure:  # noqa: PERF203 (each job must be checked)
            failures.append(failure)
    if failures:
        raise failures[0]
    return [done for _, done in waited]
