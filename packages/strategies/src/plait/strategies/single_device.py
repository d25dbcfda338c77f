"""The strategy of one process on one device."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar, overload

import torch
from typing_extensions import override

from plait.strategies.base import BaseStrategy
from plait.strategies.collectives import LocalCollectives

if TYPE_CHECKING:
    from plait.core import Accelerator, CheckpointIO, Precision
    from plait.core.typing import ReduceOpLike

__all__ = ["OneProcessCollectives", "SingleDeviceStrategy"]

T = TypeVar("T")


class OneProcessCollectives:
    """The collectives of a strategy that runs in one process: copies (see `LocalCollectives`)."""

    _collectives: LocalCollectives

    @overload
    def reduce(self, value: torch.Tensor, reduce_op: ReduceOpLike = "mean") -> torch.Tensor: ...

    @overload
    def reduce(self, value: float, reduce_op: ReduceOpLike = "mean") -> float: ...

    def reduce(
        self, value: torch.Tensor | float, reduce_op: ReduceOpLike = "mean"
    ) -> torch.Tensor | float:
        """An equal copy of ``value`` (the mean of integers is floating)."""
        return self._collectives.reduce(value, reduce_op)

    def broadcast(self, obj: T, src: int = 0) -> T:
        """``obj`` itself (a tensor is copied to the device); ``src`` must be 0."""
        return self._collectives.broadcast(obj, src)

    def barrier(self, name: str | None = None, timeout: timedelta | float | None = None) -> None:
        """Return at once."""
        self._collectives.barrier(name, timeout)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` with a leading dimension of 1."""
        return self._collectives.all_gather(tensor)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002
        """``decision`` itself."""
        return self._collectives.reduce_boolean_decision(decision, all)


class SingleDeviceStrategy(OneProcessCollectives, BaseStrategy):
    """Train in this process on one device; every collective is a copy.

    Args:
        device: The device, e.g. ``"cpu"``, ``"cuda:1"`` or a `torch.device`.
        accelerator: The accelerator, or its name; that of ``device``'s type by default.
        precision: The precision plugin, or its name; ``"32-true"`` by default.
        checkpoint_io: The checkpoint IO, or its name; ``"torch"`` by default.
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        accelerator: Accelerator | str | None = None,
        precision: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
    ) -> None:
        self._device = torch.device(device)
        super().__init__(accelerator=accelerator, precision=precision, checkpoint_io=checkpoint_io)
        self._collectives = LocalCollectives(self._device)

    @override
    def default_device_type(self) -> str:
        return self._device.type

    @property
    @override
    def root_device(self) -> torch.device:
        return self._device

    @property
    @override
    def world_size(self) -> int:
        return 1

    @property
    @override
    def global_rank(self) -> int:
        return 0

    @override
    def __repr__(self) -> str:
        return f"SingleDeviceStrategy(device={str(self._device)!r})"
