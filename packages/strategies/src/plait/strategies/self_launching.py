"""Process-group strategies that start their own ranks: one per parallel device.

`SelfLaunchingStrategy` is what DDP, FSDP, DeepSpeed and the model-parallel mesh
share: how many processes a node runs, and the launcher that starts them (nothing
where a scheduler or launcher already did), by one of `START_METHODS`.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import torch

from plait.core import ConfigurationError
from plait.strategies.launchers import (
    MULTIPROCESSING_METHODS,
    ExternalLauncher,
    MultiprocessingLauncher,
    SubprocessScriptLauncher,
)
from plait.strategies.launchers.subprocess import leads_a_job
from plait.strategies.parallel import ParallelStrategy

if TYPE_CHECKING:
    from plait.core import ClusterEnvironment, Launcher

__all__ = [
    "START_METHODS",
    "SelfLaunchingStrategy",
    "check_start_method",
    "process_launcher",
    "processes_per_node",
]

START_METHODS: Final = ("popen", *MULTIPROCESSING_METHODS)
"""How DDP starts its processes: run the program again (``"popen"``), or one of
torch.multiprocessing's methods."""


def processes_per_node(
    parallel_devices: Sequence[torch.device] | None, root_device: torch.device
) -> int:
    """One process per parallel device; by default one per CUDA GPU, or one on the CPU."""
    if parallel_devices is not None:
        return len(parallel_devices)
    return max(torch.cuda.device_count(), 1) if root_device.type == "cuda" else 1


def process_launcher(
    environment: ClusterEnvironment, start_method: str, num_processes: int
) -> Launcher:
    """What starts a process-group strategy's ranks (nothing, if a scheduler already did).

    ``start_method`` is one of `START_METHODS`: ``"popen"`` runs the program again
    per rank; the others are torch.multiprocessing's. In rank 0 of a job the popen
    launcher started, it is that launcher: the job's ranks run the program too.
    """
    address, port = environment.main_address, environment.main_port
    if leads_a_job():
        # Rank 0 of ranks the popen launcher started: they run this program, and
        # every later run goes through that launcher, whatever the start method.
        return SubprocessScriptLauncher(num_processes, main_address=address, main_port=port)
    if environment.creates_processes_externally:
        return ExternalLauncher()
    if start_method == "popen":
        return SubprocessScriptLauncher(num_processes, main_address=address, main_port=port)
    return MultiprocessingLauncher(
        num_processes, start_method=start_method, main_address=address, main_port=port
    )


def check_start_method(start_method: str) -> str:
    """``start_method``, refused if it is none of `START_METHODS` or this platform lacks it.

    Whatever the number of processes: a strategy made with it would fail only once
    it starts its ranks.

    Raises:
        ConfigurationError: ``start_method`` is not one of `START_METHODS` (the
            closest is suggested), or it is ``fork`` or ``forkserver`` where the
            platform has no such start method (Windows; macOS has fork, unsafe with
            its frameworks).
    """
    if start_method not in START_METHODS:
        raise ConfigurationError.invalid_choice("start_method", start_method, START_METHODS)
    if start_method == "popen" or start_method in multiprocessing.get_all_start_methods():
        return start_method
    raise ConfigurationError(
        f"start_method={start_method!r} is not available on this platform (it has "
        f"{', '.join(multiprocessing.get_all_start_methods())}); ddp_fork and ddp_notebook "
        "start ranks by forking",
        value=start_method,
        fix="use strategy='ddp' (start_method='popen') or 'ddp_spawn' (start_method='spawn')",
    )


class SelfLaunchingStrategy(ParallelStrategy):
    """A process-group strategy that starts its own ranks: one per parallel device.

    Subclasses set ``start_method`` (one of `START_METHODS`) when they are made.
    """

    start_method: str

    @property
    def num_processes(self) -> int:
        """How many processes the launcher starts: one per parallel device."""
        return processes_per_node(self._parallel_devices, self.root_device)

    @property
    def num_nodes(self) -> int:
        """Machines in the job: its world size over the processes on each node.

        Before a launcher starts the ranks (a world of one), one node.
        """
        return max(1, self.world_size // max(1, self.num_processes))

    def size_text(self) -> str:
        """``world_size=N`` where its ranks run; in the process that launches them, their number.

        The process that calls ``fit`` under a spawning launcher is not one of the
        ranks: its own world is of one, which a description must not pass off as the
        job's.
        """
        if self.world_size == 1 and self.num_processes > 1:
            return f"world_size=1 here, {self.num_processes} processes per node when launched"
        return f"world_size={self.world_size}"

    @property
    def launcher(self) -> Launcher:
        """What starts the ranks: nothing, when a scheduler or launcher already did."""
        return process_launcher(self.cluster_environment, self.start_method, self.num_processes)
