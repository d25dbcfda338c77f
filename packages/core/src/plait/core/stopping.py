"""A graceful stop: training ended early on a signal, every rank at the same batch.

A rank that stops this way exits with status ``128 + signal`` (143 for SIGTERM),
as a shell reports a process ended by that signal, but by its own choice and after
its checkpoint is written. Launchers tell such an exit from a failure (a rank killed
by the signal has a negative exit code in Python, or no chance to save).
"""

from __future__ import annotations

import signal
from typing import Final, Protocol, runtime_checkable

from typing_extensions import override

__all__ = ["STOP_SIGNALS", "STOP_TIMEOUT", "SupportsStopTimeout", "TrainingStopped", "stopped_by"]

STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)
"""The signals a graceful stop may answer: termination, SLURM's requeue signals, Ctrl-C."""

STOP_TIMEOUT: Final = 25.0
"""Seconds a graceful stop may take, from the signal to the end of its save, by default.

Within the 30 s that torchrun's agent and SLURM's default ``KillWait`` leave between
SIGTERM and SIGKILL, with room for the process to end."""


@runtime_checkable
class SupportsStopTimeout(Protocol):
    """A launcher that kills the ranks it started when a graceful stop outlasts its bound.

    Having passed a stop signal on to its ranks, it waits ``stop_timeout`` seconds
    and its grace period for them to end, then kills those still running (ranks
    stuck in native code, which never run Python's signal handlers). The `Trainer`
    gives it the bound its ranks keep (``Trainer(stop_timeout=...)``).
    """

    stop_timeout: float | None
    """Seconds a graceful stop may take; ``None``: no bound."""


_BASE: Final = 128


class TrainingStopped(SystemExit):
    """Training stopped on a signal after saving a checkpoint to resume from.

    A `SystemExit`: left uncaught, the program exits with status ``128 + signal``
    and no traceback. Resume with the same command and ``ckpt_path="last"``.

    Attributes:
        signal: The signal that asked for the stop.
        checkpoint: Where the run was saved (``None`` if checkpointing is off).
        global_step: The optimizer steps taken when every rank stopped.
    """

    signal: signal.Signals
    checkpoint: str | None
    global_step: int

    def __init__(self, signum: int, checkpoint: str | None = None, global_step: int = 0) -> None:
        self.signal = signal.Signals(signum)
        self.checkpoint = checkpoint
        self.global_step = global_step
        super().__init__(_BASE + self.signal.value)

    def describe(self) -> str:
        """One line for the user: what stopped, where it was saved, how to resume."""
        where = (
            f"saved to {self.checkpoint}; resume with ckpt_path='last'"
            if self.checkpoint
            else "nothing was saved (checkpointing is off)"
        )
        return f"training stopped on {self.signal.name} at step {self.global_step}: {where}"

    @override
    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.signal.value, self.checkpoint, self.global_step))

    @override
    def __str__(self) -> str:
        return self.describe()


def stopped_by(exit_code: int | None) -> signal.Signals | None:
    """The signal a process stopped gracefully on, judged by its exit code, or ``None``.

    A process killed by a signal has a negative exit code (as Python reports it);
    one that stopped itself with `TrainingStopped` exits with ``128 + signal``.
    """
    if exit_code is None:
        return None
    for signum in STOP_SIGNALS:
        if exit_code == _BASE + signum.value:
            return signum
    return None
