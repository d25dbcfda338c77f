"""Telling a hang: how long the others may take once a rank is back, and where each waits.

A stuck rank answers with its stack (`plait.conformance.pool.RankPool` asks for it);
`waiting_in` reads the collective it waits in from the rank's own frames, and
`hang_headline` says it all in the failure's first line.
"""

from __future__ import annotations

import itertools
import os
import re
from typing import Final

from plait.conformance import worker
from plait.conformance.outcomes import rank_list
from plait.conformance.registry import EXAMPLE_KINDS

__all__ = ["STRAGGLER_GRACE", "hang_headline", "straggler_grace", "waiting_in"]

STRAGGLER_GRACE: Final = 10.0
"""Seconds a rank may go on after another rank has returned from an example, at least.

Every rank of an example calls the same collectives, so once one rank is back the
others follow within moments; one that does not is stuck (a barrier that let the
others go, a collective the others never called). The grace grows with the time
the first rank took (twenty times it), so a slow machine is not mistaken for a hang;
a rank that takes no part (the absent rank of a `BarrierTimeoutCase`) starts no
clock.
"""

_FRAME: Final = re.compile(r'^\s*File "(?P<file>.+)", line \d+, in (?P<function>\S+)')
_CALL: Final = re.compile(
    r"\bstrategy\.(reduce_boolean_decision|reduce|all_gather|broadcast|barrier)\("
)


def waiting_in(stack: str) -> str | None:
    """The collective a rank's stack shows it inside of, if any.

    The rank's own frames (the worker's and its kinds', `EXAMPLE_KINDS.files`) call
    the strategy's collectives; the innermost of them names the call (a strategy's
    frames below it may call others of its own).
    """
    own = {os.path.realpath(worker.__file__), *EXAMPLE_KINDS.files()}
    lines = stack.splitlines()
    calls = [
        (found.group(1), frame.group("function"))
        for line, source in itertools.pairwise(lines)
        for frame in [_FRAME.match(line)]
        if frame is not None and os.path.realpath(frame.group("file")) in own
        for found in [_CALL.search(source)]
        if found is not None
    ]
    if not calls:
        return None
    call, function = calls[-1]
    if function == "_then_reduce":
        return f"{call}() (the plain reduce every rank runs after the ranks raised)"
    return f"{call}()"


def straggler_grace(first_back: float) -> float:
    """How long the others may go on once a rank is back ``first_back`` s into an example."""
    return max(STRAGGLER_GRACE, 20 * first_back)


def hang_headline(
    stuck: list[int],
    returned: list[int],
    stacks: list[str],
    allowed: float,
    first_back: float | None,
) -> str:
    """A hang's first line: the stuck ranks, where each waits, and how it was seen.

    Args:
        stuck: The ranks that did not finish.
        returned: The ranks that did (and took part in the example).
        stacks: Each stuck rank's stack, as it answered.
        allowed: The example's deadline, in seconds.
        first_back: When the first rank came back, in seconds (``None``: none did).
    """
    places = []
    for rank, stack in zip(stuck, stacks, strict=True):
        call = waiting_in(stack)
        places.append(f"rank {rank} in {call}" if call else f"rank {rank}")
    if first_back is None or not returned:
        return f"ranks {stuck} did not finish within {allowed:g} s (a hang): " + ", ".join(places)
    verb = "was" if len(stuck) == 1 else "were"
    return (
        f"{', '.join(places)} {verb} left waiting after {rank_list(returned)} returned from "
        f"the example {first_back:.2f} s in (a hang: the others follow within moments, "
        f"these had not {straggler_grace(first_back):g} s later)"
    )
