"""Ranks agreeing on each checked call through the process group itself.

The store path (`Rendezvous`) reads every rank's call from the job's store: rank 0's
store then serves O(N) requests and O(N²) key reads per collective, which is fast at
a few ranks and seconds per collective at a thousand. Here each rank instead
reduces a 64-bit fingerprint of its call (collective, parameters, number, group)
with one all-reduce of ``(max, -min)`` over the process group: equal fingerprints on
every rank mean equal calls, and the store is not touched at all.

The store serves only what goes wrong:

* Fingerprints differ: every rank sees it in the same all-reduce result, and the
  ranks then meet once through the store (`Rendezvous`) to read every rank's call,
  so that `CollectiveMismatchError` names them as the store path does.
* A rank never comes: each rank that has waited a while posts where it waits, once
  (two store requests). At the timeout, the ranks that posted the same call count
  as arrived, and the others are named missing. A rank that was slow but came does
  not post again: a call that ends clears its position.
* A rank died: the backend reports a closed connection at once; when the launcher
  has posted the failure, `PeerFailedError` is raised instead.

The all-reduce also carries a few small integers that every rank contributes to
(a broadcast's header from its source, the votes of ``reduce_boolean_decision``),
so that those collectives need no message of their own.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Final

import torch
import torch.distributed as dist

from plait.core import CollectiveCall, CollectiveTimeoutError
from plait.strategies.failures import decode_failure
from plait.strategies.store import ABORT_KEY, MEETING_KEY

if TYPE_CHECKING:
    from plait.strategies.collectives.recorder import FlightRecorder, Record
    from plait.strategies.collectives.rendezvous import Rendezvous

__all__ = ["SLOTS", "Agreement", "fingerprint"]

SLOTS: Final = 24
"""Integers that ride along with the fingerprint; every rank's are combined by max."""

POST_AFTER: Final = 1.0
"""Seconds a rank waits before it posts where it waits (once per slow call)."""

_WHERE: Final = "where/"
_FAILURE_GRACE: Final = timedelta(seconds=5)
_MASK: Final = (1 << 62) - 1  # a fingerprint and its negation both fit an int64


def fingerprint(tag: str, sequence: int, call: CollectiveCall) -> int:
    """A 62-bit hash of ``call``, its number and its group: equal on ranks that agree."""
    text = json.dumps([tag, sequence, call.collective, call.params]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & _MASK


class Agreement:
    """Every member's call compared through one all-reduce over ``group``.

    Args:
        group: A process group that moves CPU tensors (gloo), of the ranks ``members``.
        store: The collectives' part of the job's store (positions, failures).
        aborts: Where launchers post a failed rank.
        explain: The store meeting read when calls differ, to name each rank's.
        rank: This process's global rank.
        members: The group's global ranks, in its order.
        tag: What sets this group apart from others (empty for the whole job).
        recorder: Where this rank writes down each call.
    """

    def __init__(
        self,
        *,
        group: dist.ProcessGroup,
        store: dist.Store,
        aborts: dist.Store,
        explain: Rendezvous,
        rank: int,
        members: Sequence[int],
        tag: str,
        recorder: FlightRecorder,
    ) -> None:
        self.group = group
        self.store = store
        self._aborts = aborts
        self._explain = explain
        self.rank = rank
        self.members = tuple(members)
        self._tag = tag
        self.recorder = recorder
        self._sequence = 0

    def agree(
        self, call: CollectiveCall, timeout: timedelta, slots: Sequence[int] = ()
    ) -> list[int]:
        """Wait until every member has made ``call``; raise if any made another.

        Args:
            call: This rank's call.
            timeout: How long to wait for every member.
            slots: Up to `SLOTS` non-negative integers this rank contributes.

        Returns:
            The `SLOTS` integers, each the largest any member gave (0 where none did).

        Raises:
            CollectiveMismatchError: The members' calls differ (every member raises).
            CollectiveTimeoutError: Some members did not come within ``timeout``.
            PeerFailedError: A member failed meanwhile (its launcher said so).
        """
        self._sequence += 1
        sequence = self._sequence
        mark = fingerprint(self._tag, sequence, call)
        values = torch.zeros(2 + SLOTS, dtype=torch.int64)
        values[0] = mark
        values[1] = -mark
        if slots:
            values[2 : 2 + len(slots)] = torch.tensor(list(slots), dtype=torch.int64)
        record = self.recorder.start(sequence, self.members, call, "backend")
        work = dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._wait(work, record, timeout)
        highest, negated_lowest, *combined = values.tolist()
        if highest != -negated_lowest:
            record.end("mismatch")
            self._mismatch(call, sequence, timeout)
        record.end("done")
        return combined

    def _wait(self, work: dist.Work, record: Record, timeout: timedelta) -> None:
        deadline = time.monotonic() + timeout.total_seconds()
        # Short timeouts (a barrier's) post early enough to be counted.
        first = min(POST_AFTER, timeout.total_seconds() / 4)
        posted = False
        while True:
            left = deadline - time.monotonic()
            wait = left if posted else min(first, left)
            try:
                work.wait(timedelta(seconds=max(wait, 1e-3)))
            except RuntimeError:  # a timed-out wait, or the failure (DistError is one)
                if work.is_completed():  # it ended meanwhile, or the backend failed
                    try:
                        work.wait()
                    except RuntimeError as failure:
                        record.end("failed")
                        self._failed(failure)
                    break
                if not posted:
                    self._post(record)
                    posted = True
                    continue
                if time.monotonic() >= deadline:
                    record.end("timed out")
                    raise self._timed_out(record, timeout) from None
                continue
            break
        if posted:
            self._clear()

    def _post(self, record: Record) -> None:
        # Where this rank waits, read only when a rank times out (and by a launcher
        # that reports a failed rank): one key per rank, whatever the group, as a
        # rank waits in one call at a time.
        meeting = f"{self._tag}{record.sequence}"
        where = json.dumps([meeting, f"{record.call.describe()} over ranks {list(self.members)}"])
        self.store.multi_set(  # type: ignore[attr-defined]
            [f"{MEETING_KEY}{self.rank}", f"{_WHERE}{self.rank}"], [meeting, where]
        )

    def _clear(self) -> None:
        self.store.set(f"{_WHERE}{self.rank}", "")

    def _positions(self) -> dict[int, tuple[str, str]]:
        # The error path only: one request per member.
        found = {}
        for member in self.members:
            key = f"{_WHERE}{member}"
            if self.store.check([key]):
                text = self.store.get(key)
                if text:
                    meeting, described = json.loads(text)
                    found[member] = (str(meeting), str(described))
        return found

    def _timed_out(self, record: Record, timeout: timedelta) -> CollectiveTimeoutError:
        meeting = f"{self._tag}{record.sequence}"
        positions = self._positions()
        arrived = [m for m in self.members if positions.get(m, ("", ""))[0] == meeting]
        missing = [m for m in self.members if m not in arrived]
        name = dict(record.call.params).get("name")
        error = CollectiveTimeoutError(
            record.call.collective,
            name=None if name in (None, "None") else name,
            timeout=timeout.total_seconds(),
            missing_ranks=missing,
            arrived_ranks=arrived,
        )
        elsewhere = [
            f"rank {member} in {positions[member][1]}" for member in missing if member in positions
        ]
        if elsewhere:
            error.add_note("where missing ranks were last seen waiting: " + "; ".join(elsewhere))
        error.add_note(self.recorder.note(self.rank))
        return error

    def _failed(self, error: RuntimeError) -> None:
        # A dead peer closes its connections: the backend fails at once, the
        # launcher posts which rank it was a moment later.
        try:
            self._aborts.wait([ABORT_KEY], _FAILURE_GRACE)
            failure = self._aborts.get(ABORT_KEY)
        except (RuntimeError, dist.DistError):
            raise error from None
        raise decode_failure(failure) from error

    def _mismatch(self, call: CollectiveCall, sequence: int, timeout: timedelta) -> None:
        # Every member saw the difference in the same result: they all meet once
        # more, through the store, to learn each other's calls.
        self._explain.meet(call, timeout)
        # The calls are equal: the ranks disagree on how many came before (this
        # meeting raises, naming each rank's count).
        numbered = CollectiveCall(call.collective, {**dict(call.params), "call": sequence})
        self._explain.meet(numbered, timeout)
        raise AssertionError("ranks whose fingerprints differ made equal calls")  # unreachable
