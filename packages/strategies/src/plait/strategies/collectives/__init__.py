"""The collective contract of `plait.core`, for one process and over torch.distributed.

`LocalCollectives` serves a job of one process; `DistributedCollectives` a
torch.distributed process group, each call checked against the other ranks' through
the job's store (`Rendezvous`), so that a mismatch raises instead of hanging.
"""

from plait.strategies.collectives.arguments import as_timeout
from plait.strategies.collectives.distributed import DistributedCollectives
from plait.strategies.collectives.local import LocalCollectives
from plait.strategies.collectives.rendezvous import Rendezvous

__all__ = ["DistributedCollectives", "LocalCollectives", "Rendezvous", "as_timeout"]
