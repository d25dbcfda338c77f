"""DataParallel: one process splits each batch across several CUDA GPUs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.nn import DataParallel
from typing_extensions import override

from plait.core import ConfigurationError
from plait.strategies.single_device import OneProcessStrategy

if TYPE_CHECKING:
    from plait.core import Accelerator, CheckpointIO, Precision

__all__ = ["DataParallelStrategy"]


class DataParallelStrategy(OneProcessStrategy):
    """`torch.nn.DataParallel` over this machine's CUDA GPUs, in one process.

    Each batch is split across the GPUs and the outputs gathered on the first. DDP is
    faster and works everywhere; this strategy exists for code written for
    DataParallel. Collectives are those of one process.

    Args:
        parallel_devices: The CUDA devices; every visible GPU by default.
        accelerator, precision, precision_plugin, checkpoint_io: As for the other
            strategies.

    Raises:
        ConfigurationError: There is no CUDA device, or a device is not a CUDA one.
    """

    one_process_over_devices: ClassVar[bool] = True
    """One process drives every device it is given: ``Trainer(strategy="dp",
    devices=2)`` asks for two GPUs, not two processes."""

    def __init__(
        self,
        parallel_devices: Sequence[torch.device] | None = None,
        *,
        accelerator: Accelerator | str | None = None,
        precision: Precision | str | None = None,
        precision_plugin: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
    ) -> None:
        devices = (
            list(parallel_devices)
            if parallel_devices
            else [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
        )
        if not devices or any(device.type != "cuda" for device in devices):
            found = ", ".join(str(device) for device in devices) or "none"
            raise ConfigurationError(
                f"the 'dp' strategy splits batches across CUDA GPUs, but the devices are: {found}",
                value=devices,
                fix="use strategy='ddp', which runs on CPUs and GPUs alike and is faster",
            )
        self._devices = devices
        super().__init__(
            accelerator=accelerator,
            precision=precision,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )

    @override
    def default_device_type(self) -> str:
        return "cuda"

    @property
    @override
    def root_device(self) -> torch.device:
        return self._devices[0]

    @override
    def wrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Wrap ``module`` in `DataParallel` over the devices."""
        indices = [device.index for device in self._devices]
        return DataParallel(module, device_ids=indices, output_device=indices[0])

    @override
    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module inside the `DataParallel` wrapper."""
        inner = module.module if isinstance(module, DataParallel) else module
        assert isinstance(inner, torch.nn.Module)
        return inner

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(devices={[str(d) for d in self._devices]})"
