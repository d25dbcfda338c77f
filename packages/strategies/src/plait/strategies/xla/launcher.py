"""Starting XLA replicas with torch_xla's own launcher (``xmp.spawn``)."""

from __future__ import annotations

import importlib
import os
import pickle
import tempfile
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final, ParamSpec, Protocol, TypeVar, cast

from typing_extensions import override

from plait.core import ConfigurationError, PeerFailedError
from plait.strategies.launchers.children import setting_variables
from plait.strategies.launchers.multiprocessing import pickled_work
from plait.strategies.xla import library

if TYPE_CHECKING:
    from plait.core import ClusterEnvironment

__all__ = ["DEBUG_VARIABLES", "XLALauncher"]

P = ParamSpec("P")
R = TypeVar("R")

DEBUG_VARIABLES: Final = {"PT_XLA_DEBUG": "1", "PT_XLA_DEBUG_LEVEL": "2"}
"""What ``debug=True`` sets in the replicas' environment before they touch the device:
torch_xla's debug output, which says why and where each graph compiled or ran, and
how large its inputs and outputs were (and, in a spawned replica, which imports
torch_xla afresh, a summary at exit)."""


class _Spawn(Protocol):
    def spawn(
        self,
        fn: Callable[..., object],
        args: tuple[object, ...] = (),
        nprocs: int | None = None,
        start_method: str = "spawn",
    ) -> object: ...


def _replica(ordinal: int, work: bytes, variables: Mapping[str, str], reports: str) -> None:
    # The body of each spawned replica: learn the job's address, unpickle the work
    # (so the strategies in it are made anew, in this replica), run, and report to
    # files: rank 0 its result, each its end (or its traceback).
    os.environ.update(variables)
    try:
        function, args, kwargs = pickle.loads(work)
        result = function(*args, **kwargs)
    except BaseException:
        Path(reports, f"error-{ordinal}").write_text(traceback.format_exc())
        raise
    if ordinal == 0:
        Path(reports, "result").write_bytes(pickle.dumps(result))
    Path(reports, f"done-{ordinal}").touch()


def _in_process(
    ordinal: int,
    function: Callable[..., R],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    box: list[R],
) -> None:
    del ordinal  # 0: the only replica
    box.append(function(*args, **kwargs))


def _failed_rank(reports: Path, num_processes: int) -> tuple[int, str]:
    # The first rank that reported an error; else the first that never finished
    # (killed), with nothing to show.
    for rank in range(num_processes):
        error = reports / f"error-{rank}"
        if error.is_file():
            return rank, error.read_text()
    unfinished = [r for r in range(num_processes) if not (reports / f"done-{r}").exists()]
    return (unfinished or [0])[0], ""


class XLALauncher:
    """Runs a function in every XLA replica of this host, through ``xmp.spawn``.

    One replica runs in this process. Several are started by torch_xla, one process
    per device (TPU chip), each told the job's address (``MASTER_ADDR``,
    ``MASTER_PORT``) for the strategy's store; rank 0's result comes back.

    Args:
        num_processes: How many replicas on this host: 1, or every device it has.
        environment: Where the job's store is (the launching process's view).
        devices_on_host: How many XLA devices this host has (the accelerator's count).
        variables: More environment for the replicas (``xla_debug``'s debug switches).
    """

    def __init__(
        self,
        num_processes: int,
        environment: ClusterEnvironment,
        *,
        devices_on_host: int,
        variables: Mapping[str, str] | None = None,
    ) -> None:
        self.num_processes = num_processes
        self.environment = environment
        self.devices_on_host = devices_on_host
        self.variables = dict(variables or {})

    @property
    def is_interactive_compatible(self) -> bool:
        """One replica runs here, from a notebook too; several are spawned afresh."""
        return self.num_processes == 1

    def launch(self, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``function(*args, **kwargs)`` in every replica; return rank 0's result.

        Raises:
            ConfigurationError: Several replicas on XLA:CPU (torch_xla cannot join
                them), or another number than this host's devices.
            PeerFailedError: A replica failed (torch_xla stops the others).
        """
        variables = {
            **self.variables,
            "MASTER_ADDR": self.environment.main_address,
            "MASTER_PORT": str(self.environment.main_port),
        }
        spawner = cast(
            "_Spawn", importlib.import_module("torch_xla.distributed.xla_multiprocessing")
        )
        if self.num_processes == 1:
            # One replica: torch_xla runs it in this process, which it configures as
            # a replica of one; the function runs on the caller's own objects.
            box: list[R] = []
            with setting_variables(variables):
                spawner.spawn(_in_process, args=(function, args, kwargs, box), nprocs=1)
            return box[0]
        self._check_replicas()
        work = pickled_work(function, args, kwargs)
        with tempfile.TemporaryDirectory(prefix="plait-xla-") as scratch:
            reports = Path(scratch)
            try:
                # Set here too, so that the replicas start with them (torch_xla reads
                # some when it is imported, before the work arrives).
                with setting_variables(variables):
                    spawner.spawn(_replica, args=(work, variables, scratch), nprocs=None)
            except Exception as error:
                rank, tail = _failed_rank(reports, self.num_processes)
                raise PeerFailedError(
                    rank, None, tail or f"{type(error).__name__}: {error}"
                ) from error
            return cast("R", pickle.loads((reports / "result").read_bytes()))

    def _check_replicas(self) -> None:
        kind = library.runtime().device_type()
        if kind == "CPU":
            raise ConfigurationError(
                f"{self.num_processes} XLA replicas were asked for on XLA:CPU, and "
                f"{library.MULTI_REPLICA_CPU}",
                value=self.num_processes,
                fix="on the CPU use devices=1 ('xla' or 'single_xla'), or 'xla_fsdp' to "
                "shard over several virtual CPU devices (SPMD, one process); run several "
                "replicas on a TPU",
            )
        available = self.devices_on_host
        if self.num_processes != available:
            raise ConfigurationError(
                f"{self.num_processes} XLA replicas were asked for, and torch_xla's launcher "
                f"starts one per device of this host: {available}",
                value=self.num_processes,
                choices=["1", str(available)],
                fix=f"use devices={available} (or 1)",
            )

    @override
    def __repr__(self) -> str:
        return f"XLALauncher(num_processes={self.num_processes})"
