"""The ClusterEnvironment protocol: where this process sits in the job."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["ClusterEnvironment"]


@runtime_checkable
class ClusterEnvironment(Protocol):
    """What the scheduler (or plait itself) says about this process and the job.

    Built in one step from the process's environment; its values never change.
    """

    def detect(self) -> bool:
        """Whether the current process runs under this environment."""
        ...

    @property
    def creates_processes_externally(self) -> bool:
        """Whether the scheduler starts the processes (``True``) or plait must."""
        ...

    @property
    def main_address(self) -> str:
        """The host of the rendezvous (rank 0's store)."""
        ...

    @property
    def main_port(self) -> int:
        """The port of the rendezvous."""
        ...

    @property
    def world_size(self) -> int:
        """The number of processes in the job."""
        ...

    @property
    def global_rank(self) -> int:
        """This process's rank among all processes."""
        ...

    @property
    def local_rank(self) -> int:
        """This process's rank among the processes of its node."""
        ...

    @property
    def node_rank(self) -> int:
        """The rank of this process's node."""
        ...

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check that the job's settings agree with what the scheduler launched.

        Raises:
            ConfigurationError: They disagree (e.g. SLURM's task count is not
                devices x nodes), which would otherwise hang at rendezvous.
        """
        ...
