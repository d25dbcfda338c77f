"""Strategies over several processes, joined in a torch.distributed process group."""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Final

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.core import (
    ClusterEnvironment,
    CollectiveCall,
    CollectiveTimeoutError,
    ConfigurationError,
    EnvironmentRegistry,
    ProcessLayout,
    free_port,
)
from plait.strategies.base import BaseStrategy
from plait.strategies.collectives import (
    CURRENT_RUN_KEY,
    START_PREFIX,
    DistributedCollectives,
    Rendezvous,
    run_prefix,
)
from plait.strategies.launchers.children import HOSTED_STORE_VARIABLE, die_with_parent, timeout_of
from plait.strategies.launchers.subprocess import become_rank

if TYPE_CHECKING:
    from plait.core import Accelerator, CheckpointIO, Precision

__all__ = ["BACKENDS", "ParallelStrategy"]


BACKENDS: Final = ("gloo", "nccl", "mpi", "ucc")
"""The torch.distributed backends a parallel strategy can join with."""

DEFAULT_START_TIMEOUT: Final = timedelta(minutes=10)
DEFAULT_TIMEOUT: Final = timedelta(minutes=5)
_BIND_RETRY_INTERVAL: Final = 0.05
_GROUP_STORE_KEY: Final = "plait/process-group-store-port"
_RESTART_VARIABLE: Final = "TORCHELASTIC_RESTART_COUNT"
_TORCHRUN_VARIABLE: Final = "TORCHELASTIC_RUN_ID"
_PROBE: Final = "probe/"
_PROBE_WINDOW: Final = timedelta(seconds=5)

_retained: tuple[tuple[str, int, int, int], dist.TCPStore, Iterator[int]] | None = None


class ParallelStrategy(BaseStrategy):
    """A strategy whose processes form one torch.distributed process group.

    Two timeouts: a long one while the processes start and find each other
    (``start_timeout``), and a shorter one for every collective afterwards
    (``timeout``), so that a stuck rank is reported in minutes, not hours.

    Like every `BaseStrategy`, it travels as the arguments it was made with: unpickled
    in another process (a rank a launcher started), it is made anew there and finds
    that process's place.

    Args:
        accelerator: The accelerator, or its name; CUDA when this machine has a GPU,
            else the CPU.
        parallel_devices: The device of each local rank; by default one per process
            of the accelerator's type (the CPU for every rank, or GPU ``local_rank``).
        cluster_environment: Where this process sits, or its name; detected by default.
        precision: The precision plugin, or its name; ``"32-true"`` by default.
        precision_plugin: The same, under the name Lightning's strategies take it by.
        checkpoint_io: The checkpoint IO, or its name; ``"torch"`` by default.
        process_group_backend: ``"gloo"``, ``"nccl"``, ...; NCCL on CUDA, gloo otherwise.
        timeout: How long a collective waits for the other ranks.
        start_timeout: How long start-up waits for the other ranks.
        checked_collectives: Compare every rank's call before each control collective,
            so that a mismatch raises instead of hanging.
    """

    def __init__(
        self,
        *,
        accelerator: Accelerator | str | None = None,
        parallel_devices: Sequence[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | str | None = None,
        precision: Precision | str | None = None,
        precision_plugin: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta = DEFAULT_TIMEOUT,
        start_timeout: timedelta = DEFAULT_START_TIMEOUT,
        checked_collectives: bool = True,
    ) -> None:
        self._parallel_devices = list(parallel_devices) if parallel_devices else None
        super().__init__(
            accelerator=accelerator,
            precision=precision,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        environment = (
            EnvironmentRegistry.get(cluster_environment or "auto")
            if cluster_environment is None or isinstance(cluster_environment, str)
            else cluster_environment
        )
        if not isinstance(environment, ClusterEnvironment):
            raise ConfigurationError(
                f"cluster_environment={environment!r} is not a ClusterEnvironment",
                value=environment,
                fix="pass an object that implements plait.core.ClusterEnvironment, or a name",
            )
        self.cluster_environment = environment
        self._root_device = self._choose_device()
        backend = process_group_backend or ("nccl" if self._root_device.type == "cuda" else "gloo")
        if backend not in BACKENDS:
            raise ConfigurationError.invalid_choice("process_group_backend", backend, BACKENDS)
        self.process_group_backend = backend
        given: tuple[tuple[str, object], ...] = (
            ("timeout", timeout),
            ("start_timeout", start_timeout),
        )
        for name, value in given:  # checked as given: callers pass user input
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ConfigurationError(
                    f"{name}={value!r} must be a positive timedelta",
                    value=value,
                    fix=f"pass e.g. {name}=timedelta(minutes=5)",
                )
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.checked_collectives = checked_collectives
        self._collectives: DistributedCollectives | None = None
        self._owns_process_group = False

    @override
    def default_device_type(self) -> str:
        if self._parallel_devices:
            return self._parallel_devices[0].type
        return "cuda" if torch.cuda.device_count() > 0 else "cpu"

    def _choose_device(self) -> torch.device:
        local_rank = self.cluster_environment.local_rank
        if self._parallel_devices is not None:
            if local_rank >= len(self._parallel_devices):
                raise ConfigurationError(
                    f"local rank {local_rank} has no device: parallel_devices lists "
                    f"{len(self._parallel_devices)}",
                    value=self._parallel_devices,
                    fix="list one device per process on this node",
                )
            return self._parallel_devices[local_rank]
        if self.default_device_type() == "cuda":
            return torch.device("cuda", local_rank)
        return torch.device(self.default_device_type())

    @property
    @override
    def root_device(self) -> torch.device:
        return self._root_device

    @property
    @override
    def world_size(self) -> int:
        return self.cluster_environment.world_size

    @property
    @override
    def global_rank(self) -> int:
        return self.cluster_environment.global_rank

    @property
    @override
    def layout(self) -> ProcessLayout:
        """Plain data parallelism: every rank reads its own shard of the data."""
        return ProcessLayout(world_size=self.world_size, global_rank=self.global_rank)

    @property
    def local_rank(self) -> int:
        """This process's rank on its node."""
        return self.cluster_environment.local_rank

    @property
    def process_group(self) -> dist.ProcessGroup:
        """The group the collectives (and DDP's gradients) run on.

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        return self.collectives.group

    @property
    @override
    def collectives(self) -> DistributedCollectives:
        """The collectives of this process's group.

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        if self._collectives is None:
            raise ConfigurationError(
                "the strategy has not joined its process group yet",
                fix="call strategy.setup_environment() first",
            )
        return self._collectives

    @override
    def setup_environment(self) -> None:
        """Make the device current and join the process group (once).

        Raises:
            ConfigurationError: torch.distributed was initialised by someone else,
                so the strategy cannot own the group's store and timeouts.
            CollectiveTimeoutError: Ranks did not all arrive within ``start_timeout``
                (they are named), or rank 0's rendezvous could not be reached.
        """
        super().setup_environment()
        if self._collectives is not None:
            return
        if dist.is_initialized():
            raise ConfigurationError(
                "torch.distributed is already initialised: the strategy joins the process "
                "group itself, with its own timeouts and store",
                fix="remove the call to init_process_group and let setup_environment() do it",
            )
        environment = self.cluster_environment
        become_rank()  # a rank the popen launcher started: tied to its launcher
        if _TORCHRUN_VARIABLE in os.environ:
            # torchrun starts each worker in a session of its own: should torchrun
            # die without stopping them (SIGKILL), they must not live on.
            die_with_parent()
        store = self._run_store()
        # Every rank posts its arrival: a rank that never comes is named, not waited on.
        Rendezvous(
            store,
            rank=environment.global_rank,
            world_size=environment.world_size,
            prefix=START_PREFIX,
        ).meet(CollectiveCall("start-up"), self.start_timeout)
        dist.init_process_group(
            self.process_group_backend,
            store=self._group_store(store),
            rank=environment.global_rank,
            world_size=environment.world_size,
            timeout=self.start_timeout,
        )
        self._owns_process_group = True
        group = dist.new_group(backend=self.process_group_backend, timeout=self.timeout)
        self._collectives = DistributedCollectives(
            group=group,
            store=store,
            rank=environment.global_rank,
            world_size=environment.world_size,
            device=self.root_device,
            checked=self.checked_collectives,
            timeout=self.timeout,
        )

    def _run_store(self) -> dist.Store:
        # The job's store is kept for the life of the process and shared by every run
        # in it (a test after a fit), each run under a prefix of its own: ranks count
        # their runs alike, as they run the same program. A store made anew per run
        # could be reached, by a fast rank, while the previous one was still closing.
        environment = self.cluster_environment
        key = (
            environment.main_address,
            environment.main_port,
            environment.world_size,
            environment.global_rank,
        )
        global _retained  # noqa: PLW0603 (one job store per process, kept for its life)
        if _retained is None or _retained[0] != key:
            _retained = (key, self._connect(), itertools.count())
        _, job_store, runs = _retained
        store: dist.Store = job_store
        # torchrun keeps its store across the restarts of a job: each attempt keeps
        # its keys apart, or a restarted rank would read the dead attempt's.
        attempt = int(os.environ.get(_RESTART_VARIABLE, "0") or 0)
        if attempt:
            store = dist.PrefixStore(f"plait/attempt-{attempt}/", store)
        run = next(runs)
        if environment.global_rank == 0:
            store.set(CURRENT_RUN_KEY, str(run))
        return dist.PrefixStore(run_prefix(run), store)

    def _group_store(self, store: dist.Store) -> dist.TCPStore:
        # The process group gets a store of its own, on a port rank 0 picks and
        # shares: a DDP wrapper keeps its group, and the group's store, alive for
        # the life of the process, and the job's port must be free for the next run
        # in the same program (a test after a fit).
        environment = self.cluster_environment
        if environment.global_rank == 0:
            group_store = self._tcp_store(free_port(environment.main_address))
            store.set(_GROUP_STORE_KEY, str(group_store.port))
            return group_store
        store.wait([_GROUP_STORE_KEY], self.start_timeout)
        return self._tcp_store(int(store.get(_GROUP_STORE_KEY)))

    def _tcp_store(self, port: int, *, hosted: bool = False) -> dist.TCPStore:
        environment = self.cluster_environment
        return dist.TCPStore(
            environment.main_address,
            port,
            environment.world_size,
            is_master=environment.global_rank == 0 and not hosted,
            timeout=self.start_timeout,
            wait_for_workers=False,
        )

    def _connect(self) -> dist.TCPStore:
        environment = self.cluster_environment
        deadline = time.monotonic() + self.start_timeout.total_seconds()
        while True:
            try:
                # A launcher that serves the job's store itself says so: then rank 0
                # connects to it, as every other rank does.
                hosted = os.environ.get(HOSTED_STORE_VARIABLE) == "1"
                return self._tcp_store(environment.main_port, hosted=hosted)
            except dist.DistNetworkError as error:  # noqa: PERF203 (a retry: the error is the signal)
                # Rank 0 of a second run in one program (a test after a fit) binds the
                # port of the first run's store, which may still be closing: wait for
                # the port, as the other ranks wait to connect.
                if "EADDRINUSE" not in str(error) or time.monotonic() > deadline:
                    raise self._start_up_failed() from error
                time.sleep(_BIND_RETRY_INTERVAL)
            except (RuntimeError, dist.DistError) as error:
                raise self._start_up_failed() from error

    def _start_up_failed(self) -> CollectiveTimeoutError:
        environment = self.cluster_environment
        return CollectiveTimeoutError(
            "start-up",
            name=f"{environment.main_address}:{environment.main_port}",
            timeout=self.start_timeout.total_seconds(),
            missing_ranks=[0],
            arrived_ranks=[environment.global_rank],
        )

    @override
    def on_exception(self, exception: BaseException) -> None:
        """Name the ranks a timed-out collective waited for, when the backend did not.

        A backend's timeout (gloo's "Timed out waiting 300000ms") says nothing of
        who is late. Every rank that timed out posts to the job's store and waits a
        little for the others to do the same; the ranks that never do are stuck
        elsewhere (stalled), and the error raised in place of the backend's names
        them.

        Raises:
            CollectiveTimeoutError: The exception was a backend's timeout; it names
                the ranks that did not answer (and chains the backend's error).
        """
        collectives = self._collectives
        if (
            collectives is None
            or self.world_size == 1
            or isinstance(exception, CollectiveTimeoutError)
            or not isinstance(exception, RuntimeError)
        ):
            return
        waited = timeout_of(str(exception))
        if waited is None:
            return
        answered = self._probe(collectives.store, min(self.timeout, _PROBE_WINDOW))
        if answered is None:
            return
        missing = [rank for rank in range(self.world_size) if rank not in answered]
        if missing:
            raise CollectiveTimeoutError(
                "collective",
                timeout=waited,
                missing_ranks=missing,
                arrived_ranks=answered,
            ) from exception

    def _probe(self, store: dist.Store, window: timedelta) -> list[int] | None:
        # Which ranks answer within ``window`` (None: the store is gone).
        keys = [f"{_PROBE}{rank}" for rank in range(self.world_size)]
        try:
            store.set(keys[self.global_rank], "1")
            with contextlib.suppress(RuntimeError, dist.DistError):
                store.wait(keys, window)
            return [rank for rank, key in enumerate(keys) if store.check([key])]
        except (RuntimeError, dist.DistError):
            return None

    @override
    def teardown(self) -> None:
        """Leave the process group (if the strategy joined it) and release the parts.

        After a clean run, rank 0 first waits for the other ranks to finish with the
        job's store, which it serves; while an exception propagates, it does not.
        """
        self._release_model()
        if self._collectives is not None and sys.exc_info()[1] is None:
            self._collectives.depart()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_process_group = False
        self._collectives = None
        super().teardown()
