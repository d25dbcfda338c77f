"""The collective contract of `plait.core`, for one process and over torch.distributed.

`LocalCollectives` serves a job of one process; `DistributedCollectives` a
torch.distributed process group, each call checked against the other ranks': through
the job's store at a few ranks (`Rendezvous`), through the process group itself at
many (`Agreement`), so that a mismatch raises instead of hanging. Each process keeps
its recent calls in a `FlightRecorder`.
"""

from plait.strategies.collectives.agreement import Agreement
from plait.strategies.collectives.arguments import as_timeout
from plait.strategies.collectives.distributed import (
    AGREEMENT_VARIABLE,
    AGREEMENTS,
    STORE_CROSSOVER,
    DistributedCollectives,
    agreement_path,
)
from plait.strategies.collectives.local import LocalCollectives
from plait.strategies.collectives.recorder import FlightRecorder, Record
from plait.strategies.collectives.rendezvous import Rendezvous

__all__ = [
    "AGREEMENTS",
    "AGREEMENT_VARIABLE",
    "STORE_CROSSOVER",
    "Agreement",
    "DistributedCollectives",
    "FlightRecorder",
    "LocalCollectives",
    "Record",
    "Rendezvous",
    "agreement_path",
    "as_timeout",
]
