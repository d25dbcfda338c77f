"""The kinds of example of the collective contract, one module each.

Each module holds one kind (`plait.conformance.ExampleKind`): its case type, how its
examples are drawn and its grid (the explicit examples every run tries first), its
property, what each rank runs and how the ranks' outcomes are judged, and registers
it in `plait.conformance.EXAMPLE_KINDS`. `CollectiveKind` is what they share; the
values the draws and grids are made of are `plait.conformance.generate`'s and
`plait.conformance.grid`'s. A new kind is one module here and its line below.
"""

from typing import Final

from plait.conformance.kinds.all_gather import ALL_GATHER, AllGatherKind
from plait.conformance.kinds.bad_arguments import BAD_ARGUMENTS, BadArgumentKind
from plait.conformance.kinds.barrier import (
    BARRIER,
    BARRIER_TIMEOUT,
    BarrierKind,
    BarrierTimeoutKind,
)
from plait.conformance.kinds.broadcast import BROADCAST, BroadcastKind
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.kinds.decision import DECISION, DecisionKind
from plait.conformance.kinds.groups import SUB_GROUPS, GroupKind
from plait.conformance.kinds.mismatch import MISMATCH, MismatchKind
from plait.conformance.kinds.point_to_point import POINT_TO_POINT, PointToPointKind
from plait.conformance.kinds.reduce import REDUCE_NUMBERS, REDUCE_TENSORS, ReduceKind

__all__ = [
    "PROPERTIES",
    "AllGatherKind",
    "BadArgumentKind",
    "BarrierKind",
    "BarrierTimeoutKind",
    "BroadcastKind",
    "CollectiveKind",
    "DecisionKind",
    "GroupKind",
    "MismatchKind",
    "PointToPointKind",
    "ReduceKind",
]

PROPERTIES: Final = (
    REDUCE_TENSORS,
    REDUCE_NUMBERS,
    BROADCAST,
    ALL_GATHER,
    SUB_GROUPS,
    DECISION,
    BARRIER,
    BARRIER_TIMEOUT,
    POINT_TO_POINT,
    MISMATCH,
    BAD_ARGUMENTS,
)
"""Every property of the collective contract, in the order the suite runs them."""
