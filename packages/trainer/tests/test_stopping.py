"""Stop signals during fit: which ones, how a single process catches them, and the bound
on a stop that no batch acts on."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from plait.core import ConfigurationError
from plait.strategies.collectives import LocalCollectives
from plait.trainer.stopping import GracefulStop, parse_stop_signals


def test_auto_is_sigterm_and_sigusr1_under_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert parse_stop_signals("auto") == (signal.SIGTERM,)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert parse_stop_signals("auto") == (signal.SIGTERM, signal.SIGUSR1)


def test_names_numbers_and_none() -> None:
    assert parse_stop_signals(["usr1", "SIGTERM", int(signal.SIGUSR1)]) == (
        signal.SIGUSR1,
        signal.SIGTERM,
    )
    assert parse_stop_signals(()) == ()


@pytest.mark.parametrize("bad", [["SIGKILL"], ["SIGSEGV"], [99], [True], "SIGTERM", 15])
def test_signals_that_cannot_stop_training_gracefully_are_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="SIGTERM"):
        parse_stop_signals(bad)


def test_a_signal_raises_the_flag_and_the_previous_handler_comes_back() -> None:
    calls: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, _: calls.append(signum))
    collectives = LocalCollectives(torch.device("cpu"))
    try:
        with GracefulStop([signal.SIGUSR2]) as stop:
            assert stop.after_batch(collectives, 1) is None
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.after_batch(collectives, 1) is signal.SIGUSR2
        assert calls == [signal.SIGUSR2]  # the handler installed before still ran
        os.kill(os.getpid(), signal.SIGUSR2)
        assert calls == [signal.SIGUSR2, signal.SIGUSR2]  # and is back in place
    finally:
        signal.signal(signal.SIGUSR2, previous)


_STUCK = """
import os, signal, sys, time
from plait.trainer.stopping import GracefulStop

def asleep_in_user_code():
    time.sleep(120)

with GracefulStop([signal.SIGTERM], timeout=float(sys.argv[1])) as stop:
    os.kill(os.getpid(), signal.SIGTERM)  # a batch never comes to act on it
    if sys.argv[2] == "twice":
        os.kill(os.getpid(), signal.SIGTERM)
    asleep_in_user_code()
print("not reached")
"""


@pytest.mark.parametrize("signals", ["once", "twice"])
def test_a_stop_no_batch_acts_on_ends_the_process_within_its_bound(signals: str) -> None:
    # A rank asleep in the user's code when the stop comes: it ends itself, killed
    # (not a graceful stop's status: it saved nothing), saying where it was. A second
    # signal (the scheduler's, beside the launcher's) changes nothing.
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _STUCK, "0.5", signals],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "not reached" not in done.stdout
    assert time.monotonic() - started < 60
    assert "did not end within 0.5 s (stop_timeout)" in done.stderr
    assert "in asleep_in_user_code" in done.stderr  # where the main thread was


def test_a_stop_that_ends_in_time_is_not_cut_short() -> None:
    with GracefulStop([signal.SIGUSR2], timeout=0.2) as stop:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.received is signal.SIGUSR2
    time.sleep(0.5)  # past the bound: the process is still here, the timer cancelled
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
