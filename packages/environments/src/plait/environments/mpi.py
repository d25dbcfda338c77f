"""The environment of processes started by ``mpirun`` (Open MPI, MPICH, Intel MPI)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import attrs
from typing_extensions import Self, override

from plait.core import free_port, require_module
from plait.environments.base import BaseEnvironment
from plait.environments.variables import read_int, read_port

__all__ = ["MPIEnvironment"]

# (size, rank, local rank, local size) as each MPI implementation names them.
_FLAVOURS = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)  # fmt: skip


def _agree_on_rendezvous() -> tuple[str, int]:
    # Rank 0 offers its host and a free port; every rank takes them.
    mpi = require_module(
        "mpi4py.MPI",
        feature="the 'mpi' cluster environment (without MASTER_ADDR and MASTER_PORT)",
        install="plait-environments[mpi]",
    )
    comm = mpi.COMM_WORLD
    offer = (socket.gethostname(), free_port("")) if comm.Get_rank() == 0 else None
    address, port = comm.bcast(offer, root=0)
    return str(address), int(port)


@attrs.frozen(kw_only=True)
class MPIEnvironment(BaseEnvironment):
    """Processes started by ``mpirun``, read from the MPI implementation's variables.

    The rendezvous is ``MASTER_ADDR``/``MASTER_PORT`` when set; otherwise rank 0
    shares its host and a free port with every rank through mpi4py, imported only
    then. Nodes are assumed to run equally many ranks, placed in blocks (mpirun's
    default), so the node rank is the global rank divided by the ranks per node.
    """

    name = "mpi"

    @classmethod
    @override
    def matches(cls, environ: Mapping[str, str]) -> dict[str, str] | None:
        """The world size variable of Open MPI or MPICH/Intel MPI."""
        for size, rank, _, _ in _FLAVOURS:
            if size in environ and rank in environ:
                return {size: environ[size], rank: environ[rank]}
        return None

    @classmethod
    @override
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read the MPI implementation's variables.

        Raises:
            ConfigurationError: A variable is malformed, or none is set.
            MissingDependencyError: mpi4py is needed for the rendezvous and missing.
        """
        environ = os.environ if environ is None else environ
        env = cls.name
        size, rank, local_rank, local_size = next(
            (flavour for flavour in _FLAVOURS if flavour[0] in environ), _FLAVOURS[0]
        )
        world_size = read_int(environ, size, environment=env, minimum=1)
        global_rank = read_int(environ, rank, environment=env)
        per_node = read_int(environ, local_size, environment=env, default=world_size, minimum=1)
        if "MASTER_ADDR" in environ and "MASTER_PORT" in environ:
            address = environ["MASTER_ADDR"]
            port = read_port(environ, "MASTER_PORT", environment=env)
        else:
            address, port = _agree_on_rendezvous()
        return cls(
            main_address=address,
            main_port=port,
            world_size=world_size,
            global_rank=global_rank,
            local_rank=read_int(environ, local_rank, environment=env, default=0),
            node_rank=global_rank // per_node,
        )
