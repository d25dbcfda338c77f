"""The XLA accelerator (TPUs, and XLA on GPU or CPU), through torch_xla."""

from __future__ import annotations

import functools
import importlib
import os
import sys
from types import ModuleType

from typing_extensions import override

from plait.accelerators.base import DeviceAccelerator
from plait.core import ConfigurationError, MissingDependencyError, require_module

__all__ = ["XLAAccelerator"]


@functools.cache
def _runtime() -> ModuleType | ConfigurationError | MissingDependencyError:
    # torch_xla is imported on first use only: it is heavy, and its binary works with
    # one torch version alone, so importing it can fail for reasons beyond absence.
    try:
        require_module(
            "torch_xla", feature="the 'xla' accelerator", install="plait-accelerators[xla]"
        )
        return require_module(
            "torch_xla.runtime", feature="the 'xla' accelerator", install="plait-accelerators[xla]"
        )
    except MissingDependencyError as error:
        return error
    except (ImportError, OSError, RuntimeError) as error:
        return ConfigurationError(
            f"torch_xla is installed but cannot be imported: {type(error).__name__}: {error}",
            value="xla",
            fix="install the torch_xla release built for this torch version",
        )


def _cpu_devices(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigurationError(
            f"CPU_NUM_DEVICES={value!r} is not a number of XLA:CPU devices",
            value=value,
            fix="set CPU_NUM_DEVICES to a whole number of at least 1, or unset it (1)",
        )
    return count


class XLAAccelerator(DeviceAccelerator):
    """XLA devices (TPU cores, or XLA on GPU/CPU as PJRT_DEVICE says), one per process.

    torch_xla is imported when the accelerator is first asked about its devices,
    never when plait is imported.
    """

    name = "xla"
    device_type = "xla"

    @override
    def is_available(self) -> bool:
        runtime = _runtime()
        return isinstance(runtime, ModuleType) and self.device_count() > 0

    @override
    def device_count(self) -> int:
        """How many XLA devices this host has, without starting XLA's runtime if it can.

        A runtime started in the launching process keeps torch_xla's launcher from
        starting replicas, so the count is read from the host where torch_xla
        allows it: ``CPU_NUM_DEVICES`` on the CPU, the TPU chips' cores on a TPU.
        """
        runtime = _runtime()
        if not isinstance(runtime, ModuleType):
            return 0
        if not sys.modules["torch_xla"]._XLAC._xla_runtime_is_initialized():
            kind = runtime.device_type()
            if kind == "CPU":
                return _cpu_devices(os.environ.get("CPU_NUM_DEVICES", "1"))
            if kind == "TPU":
                tpu = importlib.import_module("torch_xla._internal.tpu")
                chips: int = tpu.num_available_devices()
                return chips
        count: int = runtime.addressable_runtime_device_count()
        return count

    @override
    def require_available(self) -> None:
        """Raise unless torch_xla imports and sees a device.

        Raises:
            MissingDependencyError: torch_xla is not installed.
            ConfigurationError: It does not import, or sees no device.
        """
        runtime = _runtime()
        if not isinstance(runtime, ModuleType):
            raise runtime
        super().require_available()
