"""The environment of processes started by IBM Spectrum LSF (``jsrun``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import attrs
from typing_extensions import Self, override

from plait.core import ConfigurationError
from plait.environments.base import BaseEnvironment
from plait.environments.variables import job_port, read_int, require

__all__ = ["LSFEnvironment"]


def _compute_hosts(rankfile: str) -> list[str]:
    # The rank file lists one host per slot; its first line is the launch node, which
    # runs no task. The compute hosts, in order, number the nodes.
    try:
        lines = Path(rankfile).read_text().split()
    except OSError as error:
        raise ConfigurationError(
            f"lsf: cannot read the rank file LSB_DJOB_RANKFILE={rankfile!r}: {error}",
            value=rankfile,
            fix="run inside an LSF job, whose rank file lists its hosts",
        ) from None
    hosts = list(dict.fromkeys(lines[1:]))
    if not hosts:
        raise ConfigurationError(
            f"lsf: the rank file {rankfile!r} lists no compute host",
            value=rankfile,
            fix="run inside an LSF job with at least one compute host",
        )
    return hosts


@attrs.frozen(kw_only=True)
class LSFEnvironment(BaseEnvironment):
    """Processes started by ``jsrun`` in an LSF job.

    Ranks come from ``JSM_NAMESPACE_SIZE``, ``JSM_NAMESPACE_RANK`` and
    ``JSM_NAMESPACE_LOCAL_RANK``; the nodes from the job's rank file
    (``LSB_DJOB_RANKFILE``): the first compute host is the rendezvous, and this
    host's position among them is the node rank. The rendezvous port is
    ``MASTER_PORT``, else ``10000 + LSB_JOBID % 1000``, as Lightning derives it.
    """

    name = "lsf"
    detected_by = (
        "LSB_JOBID",
        "LSB_DJOB_RANKFILE",
        "JSM_NAMESPACE_LOCAL_RANK",
        "JSM_NAMESPACE_SIZE",
    )
    """``LSB_JOBID``, ``LSB_DJOB_RANKFILE`` and jsrun's ``JSM_NAMESPACE_LOCAL_RANK``
    and ``JSM_NAMESPACE_SIZE``, the variables Lightning detects LSF by."""
    variables: ClassVar[Mapping[str, str]] = {
        "main_address": "LSB_DJOB_RANKFILE",
        "main_port": "LSB_JOBID",
        "world_size": "JSM_NAMESPACE_SIZE",
        "global_rank": "JSM_NAMESPACE_RANK",
        "local_rank": "JSM_NAMESPACE_LOCAL_RANK",
        "node_rank": "LSB_DJOB_RANKFILE",
    }

    @classmethod
    @override
    def from_environ(
        cls, environ: Mapping[str, str] | None = None, *, hostname: str | None = None
    ) -> Self:
        """Read LSF's variables and rank file.

        Args:
            environ: The variables; the process's own by default.
            hostname: This host's name, as the rank file spells it; by default
                `socket.gethostname`.

        Raises:
            ConfigurationError: A variable is missing or malformed, the rank file is
                unreadable, or it does not list this host.
        """
        environ = os.environ if environ is None else environ
        env = cls.name
        hosts = _compute_hosts(require(environ, "LSB_DJOB_RANKFILE", environment=env))
        hostname = socket.gethostname() if hostname is None else hostname
        if hostname not in hosts:
            raise ConfigurationError(
                f"lsf: this host {hostname!r} is not among the job's compute hosts {hosts}",
                value=hostname,
                fix="run the training script through jsrun inside the job",
            )
        job_id = read_int(environ, "LSB_JOBID", environment=env)
        return cls(
            main_address=environ.get("MASTER_ADDR", hosts[0]),
            main_port=job_port(environ, job_id, environment=env, base=10000, spread=1000),
            world_size=read_int(environ, "JSM_NAMESPACE_SIZE", environment=env, minimum=1),
            global_rank=read_int(environ, "JSM_NAMESPACE_RANK", environment=env),
            local_rank=read_int(environ, "JSM_NAMESPACE_LOCAL_RANK", environment=env),
            node_rank=hosts.index(hostname),
        )
