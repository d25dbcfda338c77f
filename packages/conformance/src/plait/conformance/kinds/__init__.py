"""The kinds of example of the collective contract, one module each.

Each module holds what a rank runs for its kind of example and how the ranks'
outcomes are judged; importing this package makes them known to the worker and to
`plait.conformance.spec`.
"""

from plait.conformance.kinds import (
    all_gather,
    bad_arguments,
    barrier,
    broadcast,
    decision,
    groups,
    mismatch,
    reduce,
)

__all__ = [
    "all_gather",
    "bad_arguments",
    "barrier",
    "broadcast",
    "decision",
    "groups",
    "mismatch",
    "reduce",
]
