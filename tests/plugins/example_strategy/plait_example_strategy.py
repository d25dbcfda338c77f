"""A third party's strategies, registered by entry point.

- ``example_strategy``: one device, with a greeting.
- ``example_bytes_ddp``: DDP whose collectives are its own (`BytesCollectives`),
  brought in through `ParallelStrategy.make_collectives`: ``all_gather`` moves
  every dtype as raw bytes, checked across ranks with the helper plait gives.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, TypeVar, overload

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.strategies import DDPStrategy, SingleDeviceStrategy

if TYPE_CHECKING:
    from datetime import timedelta

    from plait.core import Collectives, Registry, Strategy
    from plait.core.typing import Group, ReduceOpLike
    from plait.strategies import DistributedCollectives

T = TypeVar("T")


class GreetingStrategy(SingleDeviceStrategy):
    """A single-device strategy that says hello; all else is inherited."""

    def greeting(self) -> str:
        """Say where it runs."""
        return f"hello from {self.root_device}"


class BytesCollectives:
    """Collectives of its own: ``all_gather`` as bytes, the rest from plait's.

    Every call is counted in `calls`, by name.
    """

    def __init__(self, distributed: DistributedCollectives) -> None:
        self.distributed = distributed
        self.calls: Counter[str] = Counter()

    def all_gather(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        """Gather ``tensor``'s bytes from every rank of ``group``, then view them as its dtype."""
        self.calls["all_gather"] += 1
        among = self.distributed.within(group)  # ValueError for a rank outside it
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_gather takes a tensor, got {type(tensor).__name__}")
        # Every rank's call is compared before any byte moves: a rank gathering
        # another shape or dtype raises CollectiveMismatchError instead of hanging.
        among.check("all_gather", shape=tuple(tensor.shape), dtype=tensor.dtype)
        size = among.world_size
        if tensor.numel() == 0:
            return torch.empty((size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
        # Staged where the backend moves tensors (the CPU for gloo, the GPU for NCCL),
        # in logical order whatever the input's layout.
        flat = torch.empty(tensor.numel(), dtype=tensor.dtype, device=among.comm_device)
        flat.copy_(tensor.detach().reshape(-1))
        data = flat.view(torch.uint8)
        rows = [torch.empty_like(data) for _ in range(size)]
        dist.all_gather(rows, data, group=among.group)
        gathered = torch.stack([row.view(tensor.dtype).reshape(tensor.shape) for row in rows])
        return gathered.to(tensor.device)

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
        """plait's reduce, counted."""
        self.calls["reduce"] += 1
        return self.distributed.reduce(value, group, reduce_op)

    def broadcast(self, obj: T, src: int = 0, group: Group | None = None) -> T:
        """plait's broadcast, counted."""
        self.calls["broadcast"] += 1
        return self.distributed.broadcast(obj, src, group)

    def barrier(
        self,
        name: str | None = None,
        timeout: timedelta | float | None = None,
        group: Group | None = None,
    ) -> None:
        """plait's barrier, counted."""
        self.calls["barrier"] += 1
        self.distributed.barrier(name, timeout, group)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002
        """plait's decision, counted."""
        self.calls["reduce_boolean_decision"] += 1
        return self.distributed.reduce_boolean_decision(decision, all)


class BytesDDPStrategy(DDPStrategy):
    """DDP with `BytesCollectives`."""

    @override
    def make_collectives(self, distributed: DistributedCollectives) -> Collectives:
        return BytesCollectives(distributed)


def register(registry: Registry[Strategy]) -> None:
    """The entry point: register the strategies under their names."""
    registry.register("example_strategy", GreetingStrategy, description="a third party's strategy")
    registry.register(
        "example_bytes_ddp",
        BytesDDPStrategy,
        description="a third party's DDP with collectives of its own",
    )
