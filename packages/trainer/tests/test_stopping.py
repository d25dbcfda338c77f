"""Stop signals during fit: which ones, and how a single process catches them."""

import os
import signal

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
