"""The environment of tasks started by SLURM (``srun``, ``sbatch``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import ClassVar, Final

import attrs
from typing_extensions import Self, override

from plait.core import ConfigurationError
from plait.environments.base import BaseEnvironment
from plait.environments.variables import expand_hostlist, job_port, read_int, require

__all__ = ["SLURMEnvironment"]

INTERACTIVE_JOB_NAMES: Final = frozenset({"bash", "interactive"})
"""Job names of interactive allocations, where plait starts the processes itself."""


def _task_counts(text: str) -> list[int] | None:
    # SLURM_TASKS_PER_NODE reads like "4(x2),3": 4 tasks on each of two nodes, then 3.
    counts: list[int] = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts or None


@attrs.frozen(kw_only=True)
class SLURMEnvironment(BaseEnvironment):
    """Tasks started by SLURM, one process per device.

    Detected by ``SLURM_NTASKS``, unless the job is an interactive allocation
    (``SLURM_JOB_NAME`` is ``bash`` or ``interactive``), where plait starts the
    processes. The rendezvous is rank 0's host, the first of ``SLURM_NODELIST``
    (or ``MASTER_ADDR``), at ``MASTER_PORT`` or a port derived from the job id, which
    every task computes alike.

    Attributes:
        num_nodes: Nodes in the allocation (``SLURM_NNODES``).
        tasks_per_node: Tasks on this job's first node (``SLURM_TASKS_PER_NODE``), if
            known.
        task_counts: Tasks on each node, in order (``SLURM_TASKS_PER_NODE``), if known.
        job_id: ``SLURM_JOB_ID``.
    """

    name = "slurm"
    variables: ClassVar[Mapping[str, str]] = {
        "main_address": "SLURM_NODELIST",
        "main_port": "SLURM_JOB_ID",
        "world_size": "SLURM_NTASKS",
        "global_rank": "SLURM_PROCID",
        "local_rank": "SLURM_LOCALID",
        "node_rank": "SLURM_NODEID",
    }

    num_nodes: int
    tasks_per_node: int | None
    job_id: int
    task_counts: tuple[int, ...] | None = None

    @classmethod
    @override
    def matches(cls, environ: Mapping[str, str]) -> dict[str, str] | None:
        """``SLURM_NTASKS``, in a job that is not an interactive allocation."""
        if "SLURM_NTASKS" not in environ:
            return None
        job_name = environ.get("SLURM_JOB_NAME", "")
        if job_name in INTERACTIVE_JOB_NAMES:
            return None
        return {"SLURM_NTASKS": environ["SLURM_NTASKS"], "SLURM_JOB_NAME": job_name}

    @classmethod
    @override
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read SLURM's variables.

        Raises:
            ConfigurationError: One is missing or malformed.
        """
        environ = os.environ if environ is None else environ
        env = cls.name
        job_id = read_int(environ, "SLURM_JOB_ID", environment=env)
        if "MASTER_ADDR" in environ:
            address = environ["MASTER_ADDR"]
        else:
            nodelist = environ.get("SLURM_NODELIST") or require(
                environ, "SLURM_JOB_NODELIST", environment=env
            )
            address = expand_hostlist(nodelist)[0]
        nodes_variable = "SLURM_NNODES" if "SLURM_NNODES" in environ else "SLURM_JOB_NUM_NODES"
        counts = _task_counts(environ.get("SLURM_TASKS_PER_NODE", ""))
        return cls(
            main_address=address,
            main_port=job_port(environ, job_id, environment=env),
            world_size=read_int(environ, "SLURM_NTASKS", environment=env, minimum=1),
            global_rank=read_int(environ, "SLURM_PROCID", environment=env),
            local_rank=read_int(environ, "SLURM_LOCALID", environment=env),
            node_rank=read_int(environ, "SLURM_NODEID", environment=env),
            num_nodes=read_int(environ, nodes_variable, environment=env, minimum=1),
            tasks_per_node=counts[0] if counts else None,
            task_counts=tuple(counts) if counts else None,
            job_id=job_id,
        )

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check SLURM's nodes and tasks against ``num_nodes`` and ``devices``.

        Raises:
            ConfigurationError: They differ; the message gives the ``srun``/``sbatch``
                options or the settings that make them agree.
        """
        if self.num_nodes != num_nodes:
            raise ConfigurationError(
                f"SLURM allocated {self.num_nodes} node(s) (SLURM_NNODES), "
                f"but num_nodes={num_nodes}",
                value=self.num_nodes,
                fix=f"submit with --nodes={num_nodes}, or set num_nodes={self.num_nodes}",
            )
        if self.task_counts is not None and len(set(self.task_counts)) > 1:
            listed = ", ".join(str(count) for count in self.task_counts)
            raise ConfigurationError(
                f"SLURM started different numbers of tasks on its nodes ({listed}, from "
                "SLURM_TASKS_PER_NODE), but plait needs the same number on each: "
                f"devices={num_devices} per node",
                value=self.task_counts,
                fix=f"submit with --ntasks-per-node={num_devices} (and --ntasks="
                f"{num_devices * num_nodes}, or no --ntasks): --ntasks below --nodes x "
                "--ntasks-per-node leaves the last nodes short",
            )
        if self.tasks_per_node is not None and self.tasks_per_node != num_devices:
            raise ConfigurationError(
                f"SLURM started {self.tasks_per_node} task(s) per node "
                f"(SLURM_TASKS_PER_NODE), but devices={num_devices}: plait needs one task "
                "per device",
                value=self.tasks_per_node,
                fix=f"submit with --ntasks-per-node={num_devices}, set "
                f"devices={self.tasks_per_node}, or let plait start the processes from one "
                "task with PLAIT_CLUSTER_ENVIRONMENT=local",
            )
        super().validate_settings(num_devices, num_nodes)
