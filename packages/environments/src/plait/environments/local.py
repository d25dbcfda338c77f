"""The environment of processes that plait starts itself, on one machine."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar

import attrs
from typing_extensions import Self, override

from plait.core import ConfigurationError, free_port
from plait.environments.base import BaseEnvironment
from plait.environments.variables import read_int, read_port

__all__ = ["LocalEnvironment"]


@attrs.frozen(kw_only=True)
class LocalEnvironment(BaseEnvironment):
    """Processes started by plait's launchers on this machine (the default).

    Before launching, it describes the one process that runs: rank 0 of 1, with a
    rendezvous on loopback (``127.0.0.1``, never every interface) at a free port.
    In the processes plait starts, it reads the variables the launcher set
    (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
    ``NODE_RANK``), as torchrun's children do.

    Attributes:
        launched: Whether this process was started by a launcher (``LOCAL_RANK`` is
            set), so that no new processes must be created.
    """

    name = "local"
    variables: ClassVar[Mapping[str, str]] = {
        "main_address": "MASTER_ADDR",
        "main_port": "MASTER_PORT",
        "world_size": "WORLD_SIZE",
        "global_rank": "RANK",
        "local_rank": "LOCAL_RANK",
        "node_rank": "NODE_RANK",
    }

    launched: bool = False

    @classmethod
    @override
    def matches(cls, environ: Mapping[str, str]) -> dict[str, str] | None:
        """Always: the environment when no scheduler is detected."""
        return {}

    @classmethod
    @override
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read the launcher's variables, or describe a single process before launch.

        Raises:
            ConfigurationError: A variable is set but malformed.
        """
        environ = os.environ if environ is None else environ
        env = cls.name
        port = (
            read_port(environ, "MASTER_PORT", environment=env)
            if "MASTER_PORT" in environ
            else free_port()
        )
        return cls(
            main_address=environ.get("MASTER_ADDR", "127.0.0.1"),
            main_port=port,
            world_size=read_int(environ, "WORLD_SIZE", environment=env, default=1, minimum=1),
            global_rank=read_int(environ, "RANK", environment=env, default=0),
            local_rank=read_int(environ, "LOCAL_RANK", environment=env, default=0),
            node_rank=read_int(environ, "NODE_RANK", environment=env, default=0),
            launched="LOCAL_RANK" in environ,
        )

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return self.launched

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check that plait can start the job here (or that its launcher did).

        Raises:
            ConfigurationError: More than one node was asked for, which plait cannot
                start by itself; or the processes launched do not match.
        """
        if num_nodes > 1 and not self.launched:
            raise ConfigurationError(
                f"num_nodes={num_nodes}, but no cluster environment was detected, and plait "
                "starts processes on this machine only",
                value=num_nodes,
                fix="start one process per device on every node with torchrun or your "
                "scheduler (srun, jsrun, mpirun), or set num_nodes=1",
            )
        if self.launched:
            super().validate_settings(num_devices, num_nodes)
