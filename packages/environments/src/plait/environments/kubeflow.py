"""The environment of a Kubeflow PyTorchJob: one process per pod."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar

import attrs
from typing_extensions import Self, override

from plait.core import ConfigurationError
from plait.environments.base import BaseEnvironment
from plait.environments.variables import read_int, read_port, require

__all__ = ["KubeflowEnvironment"]


@attrs.frozen(kw_only=True)
class KubeflowEnvironment(BaseEnvironment):
    """A Kubeflow PyTorchJob, whose operator starts one process per pod.

    Each pod is a node: its ``RANK`` is both its global and its node rank.
    """

    name = "kubeflow"
    detected_by = ("KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
    """Kubernetes' ``KUBERNETES_PORT`` with the operator's rendezvous variables."""
    variables: ClassVar[Mapping[str, str]] = {
        "main_address": "MASTER_ADDR",
        "main_port": "MASTER_PORT",
        "world_size": "WORLD_SIZE",
        "global_rank": "RANK",
        "node_rank": "RANK",
    }

    @classmethod
    @override
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read the PyTorchJob operator's variables.

        Raises:
            ConfigurationError: One is missing or malformed.
        """
        environ = os.environ if environ is None else environ
        env = cls.name
        rank = read_int(environ, "RANK", environment=env)
        return cls(
            main_address=require(environ, "MASTER_ADDR", environment=env),
            main_port=read_port(environ, "MASTER_PORT", environment=env),
            world_size=read_int(environ, "WORLD_SIZE", environment=env, minimum=1),
            global_rank=rank,
            local_rank=0,
            node_rank=rank,
        )

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check for one device per pod, and one pod per node.

        Raises:
            ConfigurationError: ``devices`` is not 1, or the pods are not ``num_nodes``.
        """
        if num_devices != 1:
            raise ConfigurationError(
                f"a Kubeflow PyTorchJob runs one process per pod, but devices={num_devices}",
                value=num_devices,
                fix="set devices=1 and num_nodes to the number of pods (replicas)",
            )
        super().validate_settings(num_devices, num_nodes)
