"""Where the job's store keeps what plait puts in it: one layout of keys.

The store is torch.distributed's (a ``TCPStore`` the launcher or rank 0 serves).
Each run of a program (a test after a fit) keeps its keys under a prefix of its
own; rank 0 posts the number of the run in progress, so that a launcher which must
report a failure finds them.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ABORTED",
    "ABORT_KEY",
    "CURRENT_RUN_KEY",
    "MEETING_KEY",
    "START_PREFIX",
    "STORE_PREFIX",
    "run_prefix",
]

STORE_PREFIX: Final = "plait/collectives"
"""Where the collectives keep their keys in the job's store."""

START_PREFIX: Final = "plait/start"
"""Where the ranks meet at start-up, before the process group exists."""

ABORT_KEY: Final = "abort"
"""Set by a launcher when a rank failed: every rank waiting in a check raises."""

MEETING_KEY: Final = "at/"
"""Under each rendezvous prefix, ``at/RANK`` names the meeting that rank is in."""

ABORTED: Final = '["aborted", []]'
"""What fills a dead rank's entry in a meeting, so that the others stop waiting."""

CURRENT_RUN_KEY: Final = "plait/current-run"
"""Where rank 0 posts the number of the run in progress (the job's store is reused)."""


def run_prefix(run: int) -> str:
    """The prefix of run number ``run``'s keys in the job's store."""
    return f"plait/run-{run}/"
