"""The environment of processes started by torchrun (TorchElastic)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar

import attrs
from typing_extensions import Self, override

from plait.core import ConfigurationError
from plait.environments.base import BaseEnvironment
from plait.environments.variables import read_int, read_port, require

__all__ = ["TorchElasticEnvironment"]


@attrs.frozen(kw_only=True)
class TorchElasticEnvironment(BaseEnvironment):
    """Processes started by ``torchrun`` (detected by ``TORCHELASTIC_RUN_ID``).

    Attributes:
        local_world_size: The processes torchrun started on this node
            (``LOCAL_WORLD_SIZE``).
        num_nodes: The nodes (agents) in this rendezvous round (``GROUP_WORLD_SIZE``,
            ``--nnodes``), or ``None`` where torchrun does not say.
    """

    name = "torchelastic"
    detected_by = ("TORCHELASTIC_RUN_ID",)
    """``TORCHELASTIC_RUN_ID``, which only torchrun sets."""
    variables: ClassVar[Mapping[str, str]] = {
        "main_address": "MASTER_ADDR",
        "main_port": "MASTER_PORT",
        "world_size": "WORLD_SIZE",
        "global_rank": "RANK",
        "local_rank": "LOCAL_RANK",
        "node_rank": "GROUP_RANK",
        "local_world_size": "LOCAL_WORLD_SIZE",
        "num_nodes": "GROUP_WORLD_SIZE",
    }

    local_world_size: int
    num_nodes: int | None = None

    @classmethod
    @override
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read torchrun's variables.

        Raises:
            ConfigurationError: One is missing or malformed.
        """
        environ = os.environ if environ is None else environ
        env = cls.name
        return cls(
            main_address=require(environ, "MASTER_ADDR", environment=env),
            main_port=read_port(environ, "MASTER_PORT", environment=env),
            world_size=read_int(environ, "WORLD_SIZE", environment=env, minimum=1),
            global_rank=read_int(environ, "RANK", environment=env),
            local_rank=read_int(environ, "LOCAL_RANK", environment=env),
            node_rank=read_int(environ, "GROUP_RANK", environment=env),
            local_world_size=read_int(environ, "LOCAL_WORLD_SIZE", environment=env, minimum=1),
            num_nodes=(
                read_int(environ, "GROUP_WORLD_SIZE", environment=env, minimum=1)
                if "GROUP_WORLD_SIZE" in environ
                else None
            ),
        )

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check ``--nnodes`` and ``--nproc-per-node`` against ``num_nodes`` and ``devices``.

        Raises:
            ConfigurationError: They differ.
        """
        if self.num_nodes is not None and self.num_nodes != num_nodes:
            raise ConfigurationError(
                f"torchrun formed a job of {self.num_nodes} node(s) (GROUP_WORLD_SIZE), "
                f"but num_nodes={num_nodes}",
                value=self.num_nodes,
                fix=f"run torchrun --nnodes={num_nodes} (one torchrun per machine), or "
                f"set num_nodes={self.num_nodes} (--num-nodes on the command line); under "
                "an elastic range (--nnodes=MIN:MAX), num_nodes is the number that joined",
            )
        if self.local_world_size != num_devices:
            raise ConfigurationError(
                f"torchrun started {self.local_world_size} processes on this node "
                f"(LOCAL_WORLD_SIZE), but devices={num_devices}",
                value=self.local_world_size,
                fix=f"run torchrun --nproc-per-node={num_devices}, or set "
                f"devices={self.local_world_size}",
            )
        super().validate_settings(num_devices, num_nodes)
