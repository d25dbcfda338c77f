"""A third party's strategies and checkpoint format, registered by entry point.

- ``example_strategy``: one device, with a greeting.
- ``example_bytes_ddp``: DDP whose collectives are its own (`BytesCollectives`),
  brought in through `ParallelStrategy.make_collectives`: ``all_gather`` moves
  every dtype as raw bytes, checked across ranks with the helper plait gives.
- ``example_json``: a checkpoint format of its own (`JsonFormat`): a directory
  holding ``weights.json``, the module's tensors as lists and the run's entries,
  which every strategy reads.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, overload

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.strategies import DDPStrategy, SingleDeviceStrategy

if TYPE_CHECKING:
    from datetime import timedelta

    from plait.core import CheckpointFormat, Collectives, Registry, Strategy
    from plait.core.typing import Checkpoint, Group, PathLike, ReduceOpLike
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


JSON_FILE = "weights.json"


def write_json(
    state_dict: Mapping[str, torch.Tensor], entries: Mapping[str, object], path: PathLike
) -> None:
    """Write a checkpoint of the ``example_json`` format: a directory with `JSON_FILE`."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {
        key: {"dtype": str(value.dtype).removeprefix("torch."), "values": value.tolist()}
        for key, value in state_dict.items()
    }
    text = json.dumps({"tensors": tensors, "entries": dict(entries)})
    (directory / JSON_FILE).write_text(text, encoding="utf-8")


class JsonFormat:
    """A format of a third party's: a directory whose ``weights.json`` holds the weights."""

    @property
    def name(self) -> str:
        """``"example_json"``."""
        return "example_json"

    def recognizes(self, path: PathLike) -> bool:
        """Whether ``path`` is a directory with `JSON_FILE`."""
        return "://" not in os.fspath(path) and (Path(path) / JSON_FILE).is_file()

    def read_whole(self, path: PathLike, *, optimizers: bool = True) -> Checkpoint:
        """The weights as tensors under ``state_dict``, and the entries; no optimizer."""
        del optimizers  # the format keeps none
        saved = json.loads((Path(path) / JSON_FILE).read_text(encoding="utf-8"))
        state = {
            key: torch.tensor(tensor["values"], dtype=getattr(torch, tensor["dtype"]))
            for key, tensor in saved["tensors"].items()
        }
        return {**saved["entries"], "state_dict": state}

    def consolidate(self, path: PathLike, output: PathLike, *, weights_only: bool = False) -> None:
        """Write the checkpoint as one ``torch.save`` file."""
        whole = self.read_whole(path)
        torch.save(
            {"state_dict": whole["state_dict"]} if weights_only else whole, os.fspath(output)
        )


def register_formats(registry: Registry[CheckpointFormat]) -> None:
    """The entry point of the format: register ``example_json``."""
    registry.register("example_json", JsonFormat, description="a third party's JSON weights")
