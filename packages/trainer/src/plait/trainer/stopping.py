"""Graceful stops: a signal during fit makes every rank stop at the same batch and save.

Pre-emption (SIGTERM from a scheduler, SIGUSR1 before a SLURM requeue) must not
lose the work since the last checkpoint. While `Trainer.fit` runs, the stop signals
only raise a flag. Every few training batches the ranks agree, in one small
collective, whether any of them saw a signal; the interval is chosen so that the
agreement costs a small fraction of the time of training (the ranks agree on it in
the same collective, so they always call it together). When one did, every rank
stops after the same batch, ``last.ckpt`` is written, and `fit` raises
`TrainingStopped`.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Final, Literal

import torch

from plait.core import STOP_SIGNALS, STOP_TIMEOUT, ConfigurationError, TrainingStopped

if TYPE_CHECKING:
    from plait.core import Collectives
    from plait.core.typing import SignalHandler

__all__ = ["GracefulStop", "TrainingStopped", "parse_stop_signals"]

_AGREEMENT_GAP: Final = 0.05
"""Seconds of training between two agreements, at least (a few ms of collective each)."""
_MAX_INTERVAL: Final = 1000
_SLURM_VARIABLE: Final = "SLURM_JOB_ID"


def parse_stop_signals(
    value: Literal["auto"] | Sequence[str | int] | object,
) -> tuple[signal.Signals, ...]:
    """The stop signals as given to the Trainer, resolved and checked.

    ``"auto"`` is SIGTERM, and SIGUSR1 when the job runs under SLURM.

    Raises:
        ConfigurationError: A name or number that is not a stop signal plait handles.
    """
    if value == "auto":
        found = [signal.SIGTERM]
        if _SLURM_VARIABLE in os.environ:
            found.append(signal.SIGUSR1)
        return tuple(found)
    choices = [s.name for s in STOP_SIGNALS]
    if isinstance(value, str | int) or not isinstance(value, Sequence):
        raise ConfigurationError(
            f"stop_signals={value!r} must be 'auto' or a list of signals",
            value=value,
            choices=choices,
            fix="pass e.g. stop_signals=['SIGTERM', 'SIGUSR1'], or () for none",
        )
    resolved: list[signal.Signals] = []
    for item in value:
        try:
            if isinstance(item, bool):
                raise ValueError(item)
            if isinstance(item, str):
                name = item.upper() if item.upper().startswith("SIG") else f"SIG{item.upper()}"
                signum = signal.Signals[name]
            else:
                signum = signal.Signals(item)
        except (KeyError, ValueError, TypeError):
            raise ConfigurationError.invalid_choice("stop signal", item, choices) from None
        if signum not in STOP_SIGNALS:
            raise ConfigurationError.invalid_choice(
                "stop signal",
                item,
                choices,
                fix=f"{signum.name} cannot be caught or means something else to the process",
            )
        resolved.append(signum)
    return tuple(dict.fromkeys(resolved))


class GracefulStop:
    """Catches the stop signals while training runs, and tells when to stop.

    Used as a context manager around the training loop: the previous handlers come
    back on exit. A handler installed before (a launcher's, which passes the signal
    on to the ranks it started) is still called. Signals can only be caught in the
    main thread; elsewhere nothing is installed and no signal stops training.

    The stop is bounded: if the context has not exited ``timeout`` seconds after the
    first signal (no batch ended on every rank: one is busy in the user's code, or
    gone), the process says where its main thread is and kills itself (SIGKILL: its
    exit status says it did not stop gracefully). A save still in progress then is
    never put in place, so the newest complete checkpoint stays the newest. Further
    signals change nothing: a scheduler that signals every process of a job and a
    launcher that passes the signal on send each rank two.

    Args:
        signals: The signals that ask for a stop.
        timeout: Seconds from the first signal to the end of the stop; ``None``: no bound.
    """

    def __init__(
        self, signals: Sequence[signal.Signals], timeout: float | None = STOP_TIMEOUT
    ) -> None:
        self.signals = tuple(signals)
        self.timeout = timeout
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, SignalHandler] = {}
        self._countdown = 1
        self._since = time.monotonic()
        self._batches = 0
        self._deadline: threading.Timer | None = None

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        received = signal.Signals(signum)
        if self.received is None:
            self.received = received
            if self.timeout is not None:
                self._deadline = threading.Timer(self.timeout, self._expire, (received,))
                self._deadline.daemon = True
                self._deadline.start()
        previous = self._previous.get(received)
        if callable(previous):
            previous(signum, frame)  # a launcher passing the signal on to its ranks

    def _expire(self, received: signal.Signals) -> None:
        # On the timer's thread: the main thread is stuck (a sleep, a wait for a
        # rank that is gone). Killed, the process reports what it is: not a
        # graceful stop, which exits with 128 + signal after saving.
        main = threading.main_thread()
        frame = sys._current_frames().get(main.ident or 0)
        where = "".join(traceback.format_stack(frame)) if frame is not None else ""
        sys.stderr.write(
            f"plait: the graceful stop on {received.name} did not end within "
            f"{self.timeout:g} s (stop_timeout): no training batch ended on every rank. "
            "Ending without saving (SIGKILL); the newest complete checkpoint is kept. The "
            f"main thread was at:\n{where}"
        )
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def after_batch(self, collectives: Collectives, world_size: int) -> signal.Signals | None:
        """Call after every training batch on every rank: the signal to stop on, if any.

        With several ranks, the ranks agree every few batches (the same batches on
        every rank): any rank's signal stops them all, at that batch.
        """
        if world_size == 1:
            return self.received
        self._batches += 1
        self._countdown -= 1
        if self._countdown > 0:
            return None
        elapsed = time.monotonic() - self._since
        per_batch = elapsed / self._batches
        proposal = _MAX_INTERVAL if per_batch <= 0 else math.ceil(_AGREEMENT_GAP / per_batch)
        vote = torch.tensor(
            [self.received.value if self.received else 0, min(max(proposal, 1), _MAX_INTERVAL)],
            dtype=torch.int64,
        )
        agreed = collectives.reduce(vote, reduce_op="max").tolist()
        self._countdown = int(agreed[1])
        self._since, self._batches = time.monotonic(), 0
        return signal.Signals(int(agreed[0])) if agreed[0] else None
