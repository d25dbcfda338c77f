"""Every rank's Python object, gathered in two collectives whatever the number of ranks."""

from __future__ import annotations

import pickle
from typing import Protocol, TypeVar, cast

import torch

__all__ = ["AllGathers", "gather_objects"]

T = TypeVar("T")


class AllGathers(Protocol):
    """What gathering needs of a strategy (or its collectives): ``all_gather``."""

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack every rank's ``tensor``, in rank order."""
        ...


def gather_objects(collectives: AllGathers, obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank.

    Every rank passes an object of the same type (ranks run the same program).

    Each rank pickles its object; one ``all_gather`` shares the lengths, a second
    the pickles, padded to the longest. A loop of one broadcast per rank would cost
    as many collectives as there are ranks (and through a checked store, work that
    grows with the square of their number).

    Raises:
        pickle.PicklingError: ``obj`` cannot be pickled (raised on that rank before
            any collective: the others then wait for it, so pickle only what can be).
    """
    data = pickle.dumps(obj)
    sizes = collectives.all_gather(torch.tensor([len(data)], dtype=torch.int64))
    lengths = [int(size) for size in sizes.flatten().tolist()]
    padded = torch.zeros(max(lengths), dtype=torch.uint8)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    rows = collectives.all_gather(padded).cpu()
    return [
        cast("T", pickle.loads(rows[rank, :length].numpy().tobytes()))
        for rank, length in enumerate(lengths)
    ]
