"""Ranks meeting through the job's store: each posts its call, all wait, all compare.

Checked mode: before a control collective, every rank writes what it is about to
call (a `CollectiveCall`) to the store under a sequence number, waits for every
rank's entry, and compares. Ranks that disagree all raise `CollectiveMismatchError`;
ranks that never come make the others raise `CollectiveTimeoutError` naming them; a
launcher that sees a rank die fills in its entry, and the others raise
`PeerFailedError`. Nothing hangs on a mismatch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Final

import torch.distributed as dist

from plait.core import CollectiveCall, CollectiveMismatchError, CollectiveTimeoutError
from plait.strategies.failures import decode_failure
from plait.strategies.store import ABORT_KEY, ABORTED, MEETING_KEY, STORE_PREFIX

__all__ = ["Rendezvous"]

_NOTE: Final = b"\n"  # between a rank's posted call and its note
_LEFT: Final = "left/"  # a rank that has finished with the store
_DEPARTURE_SLICE: Final = timedelta(seconds=1)


class Rendezvous:
    """Ranks meeting through a store: each posts a call, all wait, all compare.

    Args:
        store: A store every rank shares.
        rank: This process's global rank.
        world_size: The number of ranks, when every rank of the job meets.
        members: The global ranks that meet, in order, when a group of them does.
        prefix: Where in the store this rendezvous keeps its keys.
        tag: What sets this group's meetings apart from other groups' under the
            same prefix (empty for every rank of the job).
    """

    def __init__(
        self,
        store: dist.Store,
        *,
        rank: int,
        prefix: str,
        world_size: int | None = None,
        members: Sequence[int] | None = None,
        tag: str = "",
    ) -> None:
        if members is None:
            assert world_size is not None, "give world_size or members"
            members = range(world_size)
        self.store = dist.PrefixStore(prefix, store)
        self._aborts = dist.PrefixStore(STORE_PREFIX, store)  # where launchers post failures
        self.rank = rank
        self.members = tuple(members)
        self.world_size = len(self.members)
        self._tag = tag
        self._sequence = 0

    @property
    def sequence(self) -> int:
        """How many meetings this rank has entered (the number of the latest)."""
        return self._sequence

    def meet(self, call: CollectiveCall, timeout: timedelta, note: bytes = b"") -> list[bytes]:
        """Wait until every member has posted its call, and compare the calls.

        Each rank may attach a ``note``, which travels with its call but is not
        compared (a broadcast's source describes what it sends in it).

        Returns:
            Every member's note, in the order of `members`.

        Raises:
            CollectiveTimeoutError: Some ranks did not arrive within ``timeout``.
            CollectiveMismatchError: The ranks' calls differ.
            PeerFailedError: A rank failed meanwhile (its launcher said so).
        """
        self._sequence += 1
        meeting = f"{self._tag}{self._sequence}"
        keys = [f"{meeting}/{member}" for member in self.members]
        # The call, and where this rank is: a launcher that sees a rank die fills in
        # the dead rank's entry here, which ends this wait at once.
        # multi_set is one round trip; torch's type stubs omit it, which it has.
        self.store.multi_set(  # type: ignore[attr-defined]
            [f"{meeting}/{self.rank}", f"{MEETING_KEY}{self.rank}"],
            [json.dumps([call.collective, call.params]).encode() + _NOTE + note, meeting],
        )
        try:
            self.store.wait(keys, timeout)
        except (RuntimeError, dist.DistError) as error:
            arrived = [
                m for m, key in zip(self.members, keys, strict=True) if self.store.check([key])
            ]
            missing = [member for member in self.members if member not in arrived]
            name = dict(call.params).get("name")
            raise CollectiveTimeoutError(
                call.collective,
                name=None if name in (None, "None") else name,
                timeout=timeout.total_seconds(),
                missing_ranks=missing,
                arrived_ranks=arrived,
            ) from error
        posted = self.store.multi_get(keys)
        if ABORTED.encode() in posted:
            raise decode_failure(self._aborts.get(ABORT_KEY))
        # JSON text holds no raw newline: the first one ends the call.
        encoded, notes = zip(*(value.partition(_NOTE)[::2] for value in posted), strict=True)
        if len(set(encoded)) > 1:
            calls = {}
            for member, text in zip(self.members, encoded, strict=True):
                collective, params = json.loads(text)
                calls[member] = CollectiveCall(collective, dict(params))
            raise CollectiveMismatchError(calls)
        # Every member has passed the previous meeting, so this rank's key of the one
        # before it is read by nobody any more.
        if self._sequence > 2:
            self.store.delete_key(f"{self._tag}{self._sequence - 2}/{self.rank}")
        return list(notes)

    def depart(self, timeout: timedelta) -> None:
        """Say this rank is done with the store; rank 0, which serves it, waits for all.

        Rank 0's store must outlive every other rank's last use of it. The wait ends
        early when a launcher posts a failure, and never raises: it runs in teardown.
        """
        try:
            self.store.set(f"{_LEFT}{self.rank}", "1")
            if self.rank != 0:
                return
            keys = [f"{_LEFT}{member}" for member in self.members]
            deadline = time.monotonic() + timeout.total_seconds()
            while time.monotonic() < deadline and not self._aborts.check([ABORT_KEY]):
                try:
                    self.store.wait(keys, _DEPARTURE_SLICE)
                except (RuntimeError, dist.DistError):
                    continue  # not every rank has left yet: look for a failure, wait on
                return
        except (RuntimeError, dist.DistError):
            return  # the store is gone (rank 0 failed): nothing is left to wait for
