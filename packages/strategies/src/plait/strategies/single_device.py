"""The strategy of one process on one device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from plait.core import TrainingSemantics
from plait.strategies.base import BaseStrategy
from plait.strategies.collectives import LocalCollectives

if TYPE_CHECKING:
    from plait.core import Accelerator, CheckpointIO, Precision

__all__ = ["OneProcessStrategy", "SingleDeviceStrategy"]


class OneProcessStrategy(BaseStrategy):
    """A strategy that runs in this process alone: its collectives are copies."""

    @property
    @override
    def collectives(self) -> LocalCollectives:
        return LocalCollectives(self.root_device)

    @property
    @override
    def world_size(self) -> int:
        return 1

    @property
    @override
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        """This process's rank on its node: 0."""
        return 0

    @property
    def num_nodes(self) -> int:
        """Machines in the job: 1."""
        return 1


class SingleDeviceStrategy(OneProcessStrategy):
    """Train in this process on one device; every collective is a copy.

    Args:
        device: The device, e.g. ``"cpu"``, ``"cuda:1"`` or a `torch.device`.
        accelerator: The accelerator, or its name; that of ``device``'s type by default.
        precision: The precision plugin, or its name; ``"32-true"`` by default.
        precision_plugin: The same, under the name Lightning's strategies take it by.
        checkpoint_io: The checkpoint IO, or its name; ``"torch"`` by default.
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        accelerator: Accelerator | str | None = None,
        precision: Precision | str | None = None,
        precision_plugin: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
    ) -> None:
        self._device = torch.device(device)
        super().__init__(
            accelerator=accelerator,
            precision=precision,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )

    @property
    @override
    def training_semantics(self) -> TrainingSemantics:
        """One replica, bit-for-bit resumes; a checkpoint moves to DDP (of one process)."""
        return TrainingSemantics(compatible=("ddp",), precisions=("32-true", "bf16-mixed"))

    @override
    def default_device_type(self) -> str:
        return self._device.type

    @property
    @override
    def root_device(self) -> torch.device:
        """The device, with its index: ``"cuda"`` alone is the process's current GPU.

        An accelerator's collectives, memory statistics and ``set_device`` need the
        index; it is read once, when first asked for, so that building the strategy
        does not initialise the accelerator.
        """
        kind = self._device.type
        index: int | None = self._device.index  # torch's stubs say int; it is None for "cuda"
        if index is None and kind != "cpu":
            try:
                module = torch.get_device_module(kind)
            except RuntimeError:  # a type torch has no module for (xla, meta)
                return self._device
            current = getattr(module, "current_device", None)  # mps has none: one device
            if current is not None and module.is_available():
                self._device = torch.device(kind, int(current()))
        return self._device

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={str(self._device)!r})"
