"""The Collectives protocol: the collective contract every strategy keeps.

The contract (proved for each strategy by ``plait.conformance``):

- `reduce` is out of place, gives every rank the same result, and
  never truncates: the mean of integer or bool input is a floating tensor. Python
  numbers come back as Python numbers; any other non-tensor raises `TypeError`.
- `broadcast` gives every rank a value equal to ``src``'s, tensors
  on the receiving rank's ``root_device``.
- `barrier` lets no rank leave before every rank has entered.
- `all_gather` stacks every rank's tensor, row ``i`` from rank ``i``.
- Ranks that disagree on a collective raise
  `CollectiveMismatchError` on every rank; a rank that dies
  makes the others raise `PeerFailedError`. Nothing hangs.
- With ``group``, all of the above holds among the group's ranks: every rank of the
  group calls, and no other; ranks keep their global numbers (``src`` is a global
  rank; rows of `all_gather` come in the group's order).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Protocol, TypeVar, overload, runtime_checkable

if TYPE_CHECKING:
    import torch

    from plait.core.typing import Group, ReduceOpLike

__all__ = ["Collectives"]

T = TypeVar("T")


@runtime_checkable
class Collectives(Protocol):
    """Reduce, broadcast, barrier and all-gather across every rank of the job."""

    @overload
    def reduce(
        self, value: torch.Tensor, group: Group | None = None, reduce_op: ReduceOpLike = "mean"
    ) -> torch.Tensor: ...

    @overload
    def reduce(
        self, value: float, group: Group | None = None, reduce_op: ReduceOpLike = "mean"
    ) -> float: ...

    def reduce(
        self,
        value: torch.Tensor | float,
        group: Group | None = None,
        reduce_op: ReduceOpLike = "mean",
    ) -> torch.Tensor | float:
        """Reduce ``value`` over the ranks (of ``group``) with ``reduce_op``, out of place.

        Raises:
            TypeError: ``value`` is neither a tensor nor a Python number.
            ConfigurationError: ``reduce_op`` is not a reduction, or ``group`` is not a
                group of this job (a reduction's name given as ``group`` says to pass
                it as ``reduce_op=``).
        """
        ...

    def broadcast(self, obj: T, src: int = 0, group: Group | None = None) -> T:
        """Give every rank (of ``group``) a value equal to global rank ``src``'s ``obj``.

        Raises:
            ValueError: ``src`` is not a rank of the job (or of ``group``).
        """
        ...

    def barrier(
        self,
        name: str | None = None,
        timeout: timedelta | float | None = None,
        group: Group | None = None,
    ) -> None:
        """Wait until every rank (of ``group``) has entered the barrier.

        Raises:
            CollectiveTimeoutError: ``timeout`` passed first; names the missing ranks.
        """
        ...

    def all_gather(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        """Stack every rank's ``tensor`` into ``[ranks, *tensor.shape]``, in rank order."""
        ...

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002
        """Whether ``decision`` holds on all ranks (``all=True``) or on any rank."""
        ...
