"""Strategies over several processes, joined in a torch.distributed process group."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Final, TypedDict, TypeVar, cast

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.core import (
    ClusterEnvironment,
    Collectives,
    CollectiveTimeoutError,
    ConfigurationError,
    EnvironmentRegistry,
    MethodEnvironment,
    ProcessLayout,
    as_cluster_environment,
)
from plait.strategies.base import BaseStrategy
from plait.strategies.collectives.distributed import AGREEMENT_VARIABLE, AGREEMENTS
from plait.strategies.job import Job, current_job, end_job, join_job
from plait.strategies.launchers.children import timeout_of
from plait.strategies.launchers.subprocess import end_a_finished_hydra_job
from plait.strategies.parts import require_parts
from plait.strategies.process_group import init_distributed

if TYPE_CHECKING:
    from plait.core import Accelerator, CheckpointIO, Precision
    from plait.strategies.collectives import DistributedCollectives

__all__ = [
    "PROCESS_GROUP_BACKENDS",
    "PROCESS_GROUP_OPTIONS",
    "ParallelStrategy",
    "ProcessGroupOptions",
    "check_backend",
    "default_backend",
    "process_group_backends",
    "process_group_options",
]

T = TypeVar("T")


PROCESS_GROUP_BACKENDS: Final = ("gloo", "nccl", "mpi", "ucc", "xccl")
"""The torch.distributed backends every torch build names; any backend a package
registers with torch (``torch.distributed.Backend.register_backend``, as Ascend's
``torch_npu`` registers ``hccl``) is accepted too, once that package is imported."""


def process_group_backends() -> tuple[str, ...]:
    """The backends this process's torch knows: the built-in ones and those registered."""
    known = [name for name in dist.Backend.backend_list if name not in ("undefined", "fake")]
    return tuple(dict.fromkeys([*PROCESS_GROUP_BACKENDS, *known]))


def default_backend(device: torch.device) -> str:
    """The backend torch pairs with ``device``'s type: NCCL for CUDA, gloo for the CPU..."""
    return dist.Backend.default_device_backend_map.get(device.type, "gloo")


def check_backend(backend: str) -> str:
    """``backend`` if torch knows it (``"gloo"``, or ``"cpu:gloo,cuda:nccl"`` per device).

    Raises:
        ConfigurationError: A backend no torch build or imported package registers.
    """
    known = process_group_backends()
    names = [part.partition(":")[2] if ":" in part else part for part in backend.split(",")]
    for name in names:
        if name.strip().lower() not in known:
            raise ConfigurationError.invalid_choice(
                "process_group_backend",
                backend,
                known,
                fix="name a backend torch knows, or 'device:backend' pairs such as "
                "'cpu:gloo,cuda:nccl'; a backend a package registers with torch (hccl "
                "from torch_npu) is known once that package is imported",
            )
    return backend


DEFAULT_START_TIMEOUT: Final = timedelta(minutes=10)
DEFAULT_TIMEOUT: Final = timedelta(minutes=5)
_PROBE: Final = "probe/"
_PROBE_WINDOW: Final = timedelta(seconds=5)


def _not_joined() -> ConfigurationError:
    return ConfigurationError(
        "the strategy has not joined its process group yet",
        fix="call strategy.setup_environment() first",
    )


class ProcessGroupOptions(TypedDict, total=False):
    """The keywords every process-group strategy takes besides its own: `ParallelStrategy`'s.

    A strategy built on `ParallelStrategy` declares them in its own signature (so that
    they are documented, checked and remade by name, as Lightning's strategies take
    them) and passes them on in one line::

        super().__init__(**process_group_options(locals()))

    `ParallelStrategy` says what each means.
    """

    accelerator: Accelerator | str | None
    parallel_devices: Sequence[torch.device] | None
    cluster_environment: ClusterEnvironment | str | None
    precision: Precision | str | None
    precision_plugin: Precision | str | None
    checkpoint_io: CheckpointIO | str | None
    process_group_backend: str | None
    timeout: timedelta
    start_timeout: timedelta
    checked_collectives: bool


PROCESS_GROUP_OPTIONS: Final = tuple(ProcessGroupOptions.__annotations__)
"""The names of `ProcessGroupOptions`, in `ParallelStrategy`'s order."""


def process_group_options(
    arguments: Mapping[str, object], **overrides: object
) -> ProcessGroupOptions:
    """The `ProcessGroupOptions` among a strategy's ``arguments``, ``overrides`` over them.

    ``arguments`` are the strategy's own (its ``__init__``'s ``locals()``); an
    override is one it decides itself (DeepSpeed's checkpoint IO, XLA's backend).
    """
    options = {name: arguments[name] for name in PROCESS_GROUP_OPTIONS if name in arguments}
    options.update(overrides)
    # Each is a keyword of the strategy's own signature, annotated as the option's.
    return cast("ProcessGroupOptions", options)


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
        process_group_backend: ``"gloo"``, ``"nccl"``, ``"xccl"``, a backend a package
            registered with torch, or ``"cpu:gloo,cuda:nccl"``; by default the one torch
            pairs with the device (NCCL on CUDA, gloo on the CPU).
        timeout: How long a collective waits for the other ranks.
        start_timeout: How long start-up waits for the other ranks.
        checked_collectives: Compare every rank's call before each control collective,
            so that a mismatch raises instead of hanging.

    How the ranks compare their calls is read from ``PLAIT_CHECK_AGREEMENT`` (one of
    ``auto``, ``store``, ``backend``; ``auto`` when unset): see
    `DistributedCollectives`. Every rank must see the same value.

    Raises:
        ConfigurationError: A timeout is not a positive timedelta, the backend or
            ``PLAIT_CHECK_AGREEMENT`` is not one of the choices.
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
        require_parts(
            self,
            accelerator=accelerator,
            precision=precision or precision_plugin,
            checkpoint_io=checkpoint_io,
            cluster_environment=cluster_environment,
        )
        super().__init__(
            accelerator=accelerator,
            precision=precision,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        # The environment of a multirun's next Hydra job, not the previous one's job.
        end_a_finished_hydra_job()
        environment = (
            EnvironmentRegistry.get(cluster_environment or "auto")
            if cluster_environment is None or isinstance(cluster_environment, str)
            else as_cluster_environment(cluster_environment)
        )
        if not isinstance(environment, ClusterEnvironment):
            raise ConfigurationError(
                f"cluster_environment={cluster_environment!r} is not a ClusterEnvironment",
                value=cluster_environment,
                fix="pass an object that implements plait.core.ClusterEnvironment, or a name",
            )
        if isinstance(environment, MethodEnvironment):
            _place(environment)
        self.cluster_environment: ClusterEnvironment = environment
        self._root_device = self._choose_device()
        self._check_devices()
        self.process_group_backend = check_backend(
            process_group_backend or default_backend(self._root_device)
        )
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
        agreement = os.environ.get(AGREEMENT_VARIABLE, "") or "auto"
        if agreement not in AGREEMENTS:
            raise ConfigurationError.invalid_choice(
                AGREEMENT_VARIABLE,
                agreement,
                AGREEMENTS,
                fix=f"set {AGREEMENT_VARIABLE} to one of {', '.join(AGREEMENTS)} (or unset it)",
            )
        self.check_agreement = agreement
        self._collectives: DistributedCollectives | None = None
        self._job: Job | None = None
        self._offered: Collectives | None = None

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

    def _check_devices(self) -> None:
        """Refuse devices no process group moves tensors of, or another accelerator's.

        Raises:
            ConfigurationError: The device is Apple's MPS, which torch.distributed
                has no backend for (Lightning refuses it too); or ``parallel_devices``
                are of another type than the accelerator given.
        """
        device = self._root_device
        if device.type == "mps":
            raise ConfigurationError(
                f"{type(self).__name__} on MPS: torch.distributed has no backend that moves "
                "MPS tensors, so ranks cannot synchronise on Apple GPUs",
                value=device,
                fix="train on one MPS device with strategy='single_device' (or 'auto'), "
                "or on several CPU processes with accelerator='cpu'",
            )
        own = getattr(self.accelerator, "device_type", None)
        if not isinstance(own, str) or own == device.type:
            return
        if self._parallel_devices is None:  # the device this machine offers by default
            raise ConfigurationError(
                f"the accelerator {self.accelerator.name!r} runs on {own} devices, and this "
                f"machine offers the strategy a {device.type} device (no {own} device is "
                "visible to torch)",
                value=self.accelerator.name,
                fix=f"run where a {own} device is visible, or pass the accelerator of this "
                f"machine (accelerator={device.type!r})",
            )
        raise ConfigurationError(
            f"parallel_devices are {device.type} devices, and the accelerator "
            f"{self.accelerator.name!r} runs on {own}: the strategy would run on one "
            "and the job be set up for the other",
            value=self._parallel_devices,
            fix=f"give {own} devices (or leave parallel_devices out: the accelerator "
            "chooses them), or the accelerator of those devices",
        )

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
    def parallel_devices(self) -> list[torch.device]:
        """The device of each process on a node: those given, else this process's.

        Assignable before the strategy is set up, as in Lightning (`assign_part`).
        """
        return list(self._parallel_devices) if self._parallel_devices else [self.root_device]

    @parallel_devices.setter
    def parallel_devices(self, devices: Sequence[torch.device]) -> None:
        self.assign_part("parallel_devices", list(devices))

    @property
    @override
    def is_set_up(self) -> bool:
        """Whether the module is set up or the process group joined."""
        return super().is_set_up or self._collectives is not None

    @property
    def process_group(self) -> dist.ProcessGroup:
        """The group the collectives (and DDP's gradients) run on.

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        return self.distributed_collectives.group

    @property
    def distributed_collectives(self) -> DistributedCollectives:
        """Plait's collectives over the job's process group, whatever `collectives` offers.

        They hold the group, the job's store, how the ranks agree on each call
        (`DistributedCollectives.check`) and the flight recorder. A strategy that
        brings its own collectives (`make_collectives`) builds on these.

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        if self._collectives is None:
            raise _not_joined()
        return self._collectives

    @property
    @override
    def collectives(self) -> Collectives:
        """The collectives of this process's group: those `make_collectives` made.

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        if self._offered is None:
            raise _not_joined()
        return self._offered

    def make_collectives(self, distributed: DistributedCollectives) -> Collectives:
        """The collectives this strategy offers, made once the process group has formed.

        By default, plait's own: ``distributed``. Override it to bring your own
        implementation of the `plait.core.Collectives` protocol (over another
        library's communicator, say). Build it on ``distributed``: its ``group``,
        ``store`` and ``rank``, and `DistributedCollectives.check`, which compares
        every rank's call before yours runs, so that a mismatch raises
        `CollectiveMismatchError` instead of hanging. The conformance suite proves
        the result keeps the contract.

        Args:
            distributed: plait's collectives over the job's process group.
        """
        return distributed

    @override
    def setup_environment(self) -> None:
        """Make the device current and join the job's process group (once per job).

        The group lives as long as the job (`plait.strategies.job`): a later run of
        this strategy, or of another with the same settings, uses it again; one with
        other settings ends it and joins anew.

        Raises:
            ConfigurationError: torch.distributed was initialised by someone else,
                so the strategy cannot own the group's store and timeouts.
            CollectiveTimeoutError: Ranks did not all arrive within ``start_timeout``
                (they are named), or rank 0's rendezvous could not be reached.
        """
        super().setup_environment()
        if self._collectives is not None:
            return
        job = join_job(self._job_settings(), self._join, self.destroy_process_group)
        self._job, self._collectives = job, job.collectives
        offered = self.make_collectives(job.collectives)
        if not isinstance(offered, Collectives):
            raise ConfigurationError(
                f"{type(self).__name__}.make_collectives returned {offered!r}, which does not "
                "implement plait.core.Collectives",
                value=offered,
                fix="return an object with reduce, broadcast, barrier, all_gather and "
                "reduce_boolean_decision (or the DistributedCollectives it was given)",
            )
        self._offered = offered

    def _job_settings(self) -> tuple[object, ...]:
        # What another strategy must share to run on the same group: the group's
        # backend, world and timeouts, how calls are checked, and how it is destroyed.
        environment = self.cluster_environment
        return (
            type(self).destroy_process_group,
            self.process_group_backend,
            environment.world_size,
            environment.global_rank,
            environment.main_address,
            environment.main_port,
            self.timeout,
            self.start_timeout,
            self.checked_collectives,
            self.check_agreement,
        )

    def _join(self) -> DistributedCollectives:
        return init_distributed(
            self.cluster_environment,
            backend=self.process_group_backend,
            device=self.root_device,
            timeout=self.timeout,
            start_timeout=self.start_timeout,
            checked=self.checked_collectives,
            agreement=self.check_agreement,
        )

    @property
    def job_generation(self) -> int | None:
        """Which job of this program the strategy runs in (None before it joins one).

        A module sharded in one job cannot be used in another: its group has ended.
        """
        job = self._job
        return job.generation if job is not None and job is current_job() else None

    def job_held(self, key: Hashable, make: Callable[[], T]) -> T:
        """What the strategy keeps for its job's life under ``key``, made once by ``make``.

        For what is made over the job's group (a device mesh): the job's next runs use
        it again, and it goes with the job.

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        job = self._job
        if job is None:
            raise _not_joined()
        if key not in job.held:
            job.held[key] = make()
        return cast("T", job.held[key])

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
        """Release the module and the parts; the process group stays for the job's next run.

        After a failure (an exception propagating), the job ends here: its group is
        destroyed without waiting for the other ranks, which are being stopped.
        The group of a job that ends well is destroyed at exit, or by
        `plait.strategies.end_job`.
        """
        self._release_model()
        if sys.exc_info()[1] is not None and self._job is not None and self._job is current_job():
            end_job(depart=False)
        self._job = None
        self._collectives = None
        self._offered = None
        super().teardown()

    def destroy_process_group(self) -> None:
        """Destroy the job's process groups (at the job's end).

        A strategy on a library that keeps references to them releases them here.
        """
        if dist.is_initialized():
            dist.destroy_process_group()


def _place(environment: MethodEnvironment) -> None:
    """Tell an environment of Lightning's kind this process's place, as Lightning does.

    Where the environment does not start the processes, plait's launchers do: a
    rank they started has its place in the variables they set (``WORLD_SIZE``,
    ``RANK``), the process that launches is rank 0 of 1 until then.
    """
    if environment.creates_processes_externally:
        return
    local = EnvironmentRegistry.get("local")
    environment.place(local.world_size, local.global_rank)
