"""The environment of XLA processes (TPU hosts), read from torch_xla's runtime."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import attrs
from typing_extensions import Self, override

from plait.core import free_port, require_module
from plait.environments.base import BaseEnvironment
from plait.environments.variables import read_port

__all__ = ["XLAEnvironment"]


@attrs.frozen(kw_only=True)
class XLAEnvironment(BaseEnvironment):
    """Processes on XLA devices, placed by torch_xla's PJRT runtime.

    Detected by ``PJRT_DEVICE``; ranks are read from ``torch_xla.runtime``, which
    is imported only when the environment is made. The address and port are those of
    rank 0's store (``MASTER_ADDR``, else loopback; ``MASTER_PORT``, else a free
    port, which a launcher passes on to its processes).

    Read before torch_xla's launcher has started the replicas (the runtime not yet
    started), the environment is this process alone: world size 1, rank 0. It does
    not start the runtime then, since a runtime started in the launching process
    keeps torch_xla's launcher from starting the replicas. Under SPMD, too, it is
    this process alone, which drives every device.
    """

    name = "xla"
    detected_by = ("PJRT_DEVICE",)
    """``PJRT_DEVICE``, which selects torch_xla's device type."""

    one_per_device: bool = True
    """Whether this process is one of one replica per device, so the devices asked for
    must match the world (not before the launch, nor under SPMD, where one process
    drives every device)."""

    @classmethod
    @override
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read the ranks from torch_xla's runtime.

        Raises:
            MissingDependencyError: torch_xla is not installed.
        """
        environ = os.environ if environ is None else environ
        runtime = require_module(
            "torch_xla.runtime",
            feature="the 'xla' cluster environment",
            install="plait-environments[xla]",
        )
        address = environ.get("MASTER_ADDR", "127.0.0.1")
        port = (
            read_port(environ, "MASTER_PORT", environment=cls.name)
            if "MASTER_PORT" in environ
            else free_port()
        )
        started = sys.modules["torch_xla"]._XLAC._xla_runtime_is_initialized()
        if not started or runtime.is_spmd():
            return cls(
                main_address=address,
                main_port=port,
                world_size=1,
                global_rank=0,
                local_rank=0,
                node_rank=0,
                one_per_device=False,
            )
        return cls(
            main_address=address,
            main_port=port,
            world_size=int(runtime.world_size()),
            global_rank=int(runtime.global_ordinal()),
            local_rank=int(runtime.local_ordinal()),
            node_rank=int(runtime.host_index()),
        )

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check a replica's world against the devices asked for (once launched).

        Before the launch there is nothing to check (torch_xla's launcher starts one
        replica per device), nor under SPMD (one process drives every device).

        Raises:
            ConfigurationError: A replica sees another number of replicas.
        """
        if self.one_per_device:
            super().validate_settings(num_devices, num_nodes)

    @property
    @override
    def creates_processes_externally(self) -> bool:
        """torch_xla's launcher, not a scheduler, starts the processes on each host."""
        return False
