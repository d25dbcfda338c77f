"""A flight recorder: each process's own ring of its most recent collectives.

Every checked collective (and every barrier) is written down as it starts and as it
ends, in memory only: no store, no message. When something goes wrong (a timeout, a
mismatch, a rank that died) the last calls of this rank say where it was, and a
timeout's error carries them.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from plait.core import CollectiveCall

__all__ = ["FlightRecorder", "Record"]

DEFAULT_CAPACITY: Final = 64
"""How many calls a recorder keeps by default: the most recent ones."""


@attrs.define
class Record:
    """One collective as this rank called it.

    Attributes:
        sequence: Its number among the checked calls of its group, from 1.
        group: The group's global ranks, in its order.
        call: What was called.
        path: How the ranks agreed on it: ``"store"`` (every rank's call read from
            the job's store) or ``"backend"`` (a fingerprint all-reduced by the
            process group).
        started: When it started (``time.monotonic()``).
        state: ``"waiting"``, ``"done"``, ``"mismatch"``, ``"timed out"`` or
            ``"failed"``.
        seconds: How long it took, once it ended.
    """

    sequence: int
    group: tuple[int, ...]
    call: CollectiveCall
    path: str
    started: float
    state: str = "waiting"
    seconds: float | None = None

    def end(self, state: str) -> None:
        """Mark the call ended, in ``state``."""
        self.state = state
        self.seconds = time.monotonic() - self.started

    def describe(self) -> str:
        """One line: number, call, group, path and how it ended."""
        took = (
            f"for {time.monotonic() - self.started:.3g} s so far"
            if self.seconds is None
            else f"after {self.seconds:.3g} s"
        )
        return (
            f"#{self.sequence} {self.call.describe()} over ranks "
            f"{list(self.group)} ({self.path}): {self.state} {took}"
        )


class FlightRecorder:
    """The most recent collectives of this process, oldest first.

    Args:
        capacity: How many calls to keep; older ones are dropped.

    Raises:
        ValueError: ``capacity`` is not a positive int.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if type(capacity) is not int or capacity < 1:  # bool is not a capacity
            raise ValueError(f"capacity={capacity!r} must be a positive int")
        self._records: deque[Record] = deque(maxlen=capacity)

    def start(
        self, sequence: int, group: tuple[int, ...], call: CollectiveCall, path: str
    ) -> Record:
        """Write down a call as it starts; `Record.end` marks it ended."""
        record = Record(sequence, group, call, path, time.monotonic())
        self._records.append(record)
        return record

    def records(self) -> list[Record]:
        """The calls kept, oldest first."""
        return list(self._records)

    def note(self, rank: int) -> str:
        """What an error of ``rank`` carries: its last calls, under a heading."""
        return f"rank {rank}'s last collectives:\n" + self.describe()

    def describe(self, last: int = 8) -> str:
        """The ``last`` calls, one per line, oldest first."""
        kept = list(self._records)[-last:] if last > 0 else []
        if not kept:
            return "no collective recorded"
        return "\n".join(record.describe() for record in kept)
