"""What a rank sends back after an example: its result as data, or the error it raised."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

__all__ = ["SHOWN", "Outcome", "RaisedError", "TensorData", "rank_list", "shown"]


@attrs.frozen
class TensorData:
    """A result tensor as data: dtype, shape, device and values in row-major order."""

    dtype: str
    shape: tuple[int, ...]
    device: str
    values: tuple[object, ...]

    def describe(self) -> str:
        """A short rendering for error messages."""
        return (
            f"tensor({shown(self.values)}, dtype={self.dtype}, shape={self.shape}, "
            f"device={self.device})"
        )


SHOWN: Final = 8
"""How many values a message shows of a tensor, on either side of a comparison."""


def rank_list(ranks: Sequence[int]) -> str:
    """``rank 2``, or ``ranks 0, 1 and 3``: ranks as a message names them."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(str(rank) for rank in ranks[:-1])} and {ranks[-1]}"


def shown(values: Sequence[object], limit: int = SHOWN) -> str:
    """``values`` as a list, cut after ``limit`` of them (the same cut on every side)."""
    if len(values) <= limit:
        return repr(list(values))
    head = ", ".join(repr(value) for value in values[:limit])
    return f"[{head}, ... ({len(values)} values)]"


@attrs.frozen
class RaisedError:
    """An exception a rank raised, with what the checks need to know about it.

    Attributes:
        type_name: The exception's class name.
        kinds: The contract's error classes it is an instance of, e.g.
            ``{"CollectiveMismatchError", "ValueError"}``.
        message: ``str(exception)``.
        traceback: The formatted traceback, for the failure report.
        calls: For a `CollectiveMismatchError`, each rank's call as text.
        missing_ranks: For a `CollectiveTimeoutError`, the ranks it names.
    """

    type_name: str
    kinds: frozenset[str]
    message: str
    traceback: str
    calls: tuple[tuple[int, str], ...] | None = None
    missing_ranks: tuple[int, ...] | None = None

    def describe(self) -> str:
        """``Type: message`` on one line."""
        first = self.message.splitlines()[0] if self.message else ""
        return f"{self.type_name}: {first}"


@attrs.frozen
class Outcome:
    """One rank's report of one example.

    Attributes:
        rank: The rank.
        result: What the collective returned (a tensor as `TensorData`).
        error: What it raised instead, if it raised.
        mutated: How the rank's input changed, if the collective changed it.
        entered: For a barrier, how many ranks had entered when this rank left.
        aliased: How the result shares memory with the input or with other
            results, if it does (results must be the caller's own).
        after: For examples where ranks raise, the result of the plain reduce
            (a sum of the ranks' numbers) every rank runs afterwards.
        after_error: What that reduce raised instead, if it raised.
    """

    rank: int
    result: object = None
    error: RaisedError | None = None
    mutated: str | None = None
    entered: int | None = None
    aliased: str | None = None
    after: object = None
    after_error: RaisedError | None = None
