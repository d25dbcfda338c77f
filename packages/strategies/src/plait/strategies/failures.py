"""A failed rank, as it travels through the job's store to the ranks still waiting."""

from __future__ import annotations

import json

import torch.distributed as dist

from plait.core import PeerFailedError
from plait.strategies.store import (
    ABORT_KEY,
    ABORTED,
    CURRENT_RUN_KEY,
    MEETING_KEY,
    STORE_PREFIX,
    run_prefix,
)

__all__ = ["decode_failure", "encode_failure", "post_failure"]


def encode_failure(failure: PeerFailedError) -> str:
    """A failure as text for the store, read back by `decode_failure`."""
    return json.dumps([failure.rank, failure.exit_code, failure.traceback_tail])


def decode_failure(text: bytes) -> PeerFailedError:
    """The failure `encode_failure` wrote."""
    rank, exit_code, tail = json.loads(text)
    return PeerFailedError(int(rank), exit_code, str(tail))


def post_failure(
    store: dist.Store, failure: PeerFailedError, *, world_size: int, prefixes: tuple[str, ...]
) -> None:
    """Tell every rank waiting in a rendezvous that ``failure`` happened.

    The failure goes under `ABORT_KEY`; then, for each rendezvous prefix and each
    rank, the failed rank's entry at that rank's current meeting is filled with a
    marker, so that the wait ends and the rank raises `PeerFailedError`.
    """
    if store.check([CURRENT_RUN_KEY]):  # the keys of the run in progress
        store = dist.PrefixStore(run_prefix(int(store.get(CURRENT_RUN_KEY))), store)
    dist.PrefixStore(STORE_PREFIX, store).set(ABORT_KEY, encode_failure(failure))
    for prefix in prefixes:
        meetings = dist.PrefixStore(prefix, store)
        for rank in range(world_size):
            if rank != failure.rank and meetings.check([f"{MEETING_KEY}{rank}"]):
                meeting = meetings.get(f"{MEETING_KEY}{rank}").decode()
                meetings.set(f"{meeting}/{failure.rank}", ABORTED)
