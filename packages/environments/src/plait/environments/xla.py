"""The environment of XLA processes (TPU hosts), read from torch_xla's runtime."""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs
from typing_extensions import Self, override

from plait.core import require_module
from plait.environments.base import BaseEnvironment

__all__ = ["XLAEnvironment"]


@attrs.frozen(kw_only=True)
class XLAEnvironment(BaseEnvironment):
    """Processes on XLA devices, placed by torch_xla's PJRT runtime.

    Detected by ``PJRT_DEVICE``; ranks are read from ``torch_xla.runtime``, which
    is imported only when the environment is made. XLA runs its own rendezvous, so
    the address and port are only reported (``MASTER_ADDR`` or loopback).
    """

    name = "xla"
    detected_by = ("PJRT_DEVICE",)
    """``PJRT_DEVICE``, which selects torch_xla's device type."""

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
        return cls(
            main_address=environ.get("MASTER_ADDR", "127.0.0.1"),
            main_port=int(environ.get("MASTER_PORT", "8470")),
            world_size=int(runtime.world_size()),
            global_rank=int(runtime.global_ordinal()),
            local_rank=int(runtime.local_ordinal()),
            node_rank=int(runtime.host_index()),
        )

    @property
    @override
    def creates_processes_externally(self) -> bool:
        """torch_xla's launcher, not a scheduler, starts the processes on each host."""
        return False
