"""The collective contract for a job of one process: every collective is a copy."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Final, TypeVar, overload

import torch
import torch.distributed as dist

from plait.core import ConfigurationError, ReduceOp
from plait.strategies.collectives.arguments import as_timeout, check_group_name, check_src
from plait.strategies.collectives.reduction import reduce_dtype, reducible, result_dtype

if TYPE_CHECKING:
    from plait.core.typing import Group, ReduceOpLike

__all__ = ["LocalCollectives"]

T = TypeVar("T")

_DIMENSIONS: Final = ("data_parallel",)


def _check_group(group: Group | None) -> None:
    if group is None:
        return
    if isinstance(group, str):
        check_group_name(group, _DIMENSIONS)
        return
    given: object = group  # checked as the object it is: callers pass user input
    if not isinstance(given, dist.ProcessGroup) or given.size() != 1:
        raise ConfigurationError(
            f"group={group!r} is not a group of this one-process job",
            value=group,
            fix="pass group=None (every rank, here one)",
        )


class LocalCollectives:
    """The contract for a job of one process: every collective is a copy.

    Its one group is the process itself: ``group`` may be ``None``,
    ``"data_parallel"``, or a process group of one rank.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

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
        """An equal copy of ``value``; the mean of integers is floating."""
        _check_group(group)
        reducible(value)
        op = ReduceOp.parse(reduce_op)
        if isinstance(value, torch.Tensor):
            dtype = reduce_dtype(value, op)
            return value.detach().to(result_dtype(value, op, dtype), copy=True)
        return float(value) if op is ReduceOp.MEAN else value

    def broadcast(self, obj: T, src: int = 0, group: Group | None = None) -> T:
        """``obj`` itself; a tensor is copied to this process's device."""
        _check_group(group)
        check_src(src, [0])
        if isinstance(obj, torch.Tensor):
            return obj.detach().to(self.device, copy=True)  # type: ignore[return-value]
        return obj

    def barrier(
        self,
        name: str | None = None,
        timeout: timedelta | float | None = None,
        group: Group | None = None,
    ) -> None:
        """Return at once: there is no other rank to wait for."""
        _check_group(group)
        as_timeout(timeout, timedelta(seconds=1))

    def all_gather(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        """``tensor`` with a leading dimension of 1."""
        _check_group(group)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_gather takes a tensor, got {type(tensor).__name__}")
        return tensor.detach().unsqueeze(0).clone()

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002
        """``decision`` itself."""
        return bool(decision)
