"""Forming the job's process group: one function, used by every parallel strategy.

`init_distributed` takes a process from its cluster environment to a joined
torch.distributed group with checked collectives: it connects to the job's store,
meets every rank there (a rank that never comes is named), checks once that the
ranks' hosts, ranks and devices make one layout (`plait.strategies.placement`),
initialises the default group on a store of its own, and makes the group the
collectives run on, with the steady-state timeout.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Final

import torch
import torch.distributed as dist

from plait.core import (
    ClusterEnvironment,
    CollectiveCall,
    CollectiveTimeoutError,
    ConfigurationError,
    reserve_port,
    take_reserved,
)
from plait.strategies.collectives import DistributedCollectives, Rendezvous, agreement_path
from plait.strategies.launchers.children import HOSTED_STORE_VARIABLE, die_with_parent
from plait.strategies.launchers.subprocess import become_rank
from plait.strategies.network import choose_gloo_interface
from plait.strategies.placement import agree_on_placement, post_placement, shares_devices
from plait.strategies.store import CURRENT_RUN_KEY, START_PREFIX, run_prefix

__all__ = ["init_distributed"]

_BIND_RETRY_INTERVAL: Final = 0.05
_GROUP_STORE_KEY: Final = "plait/process-group-store-port"
_RESTART_VARIABLE: Final = "TORCHELASTIC_RESTART_COUNT"
_TORCHRUN_VARIABLE: Final = "TORCHELASTIC_RUN_ID"
_AGENT_STORE_VARIABLE: Final = "TORCHELASTIC_USE_AGENT_STORE"

_ROUNDS: Final = "plait/rounds"
_HELLO: Final = "plait/hello/"
_WELCOME: Final = "plait/welcome/"
_READY: Final = "plait/ready/"
_ROUND_POLL_INTERVAL: Final = 0.02

_retained: tuple[tuple[str, int, int, int], dist.Store, Iterator[int]] | None = None


def init_distributed(
    environment: ClusterEnvironment,
    *,
    backend: str,
    device: torch.device,
    timeout: timedelta,
    start_timeout: timedelta,
    checked: bool = True,
    dimensions: Mapping[str, dist.ProcessGroup | None] | None = None,
    agreement: str = "auto",
) -> DistributedCollectives:
    """Join this process to the job's process group and return its collectives.

    Args:
        environment: Where this process sits (address, port, ranks).
        backend: The torch.distributed backend, e.g. ``"gloo"`` or ``"nccl"``.
        device: This process's device, where collective results land.
        timeout: How long a collective waits for the other ranks.
        start_timeout: How long start-up waits for the other ranks.
        checked: Compare every rank's call before each control collective.
        dimensions: The groups of the layout's dimensions, by name (``None``: the
            whole group); plain data parallelism by default.
        agreement: How ranks agree on each checked call (see
            `DistributedCollectives`); a group of another backend than gloo gets a
            gloo twin for it when it agrees through the process group.

    Raises:
        ConfigurationError: torch.distributed was initialised by someone else, so
            plait cannot own the group's store and timeouts; or, on rank 0, another
            program holds the job's port for all of ``start_timeout``.
        CollectiveTimeoutError: Ranks did not all arrive within ``start_timeout``
            (they are named), or rank 0's store could not be reached.
        ConfigurationError: Two ranks use one GPU (but over gloo), or claim one local rank on a
            node, or one node's ranks are on different hosts (on every rank, naming
            them; see `plait.strategies.placement.check_placements`).
    """
    if dist.is_initialized():
        raise ConfigurationError(
            "torch.distributed is already initialised: the strategy joins the process "
            "group itself, with its own timeouts and store",
            fix="remove the call to init_process_group and let setup_environment() do it",
        )
    become_rank()  # a rank the popen launcher started: tied to its launcher
    if _TORCHRUN_VARIABLE in os.environ:
        # torchrun starts each worker in a session of its own: should torchrun die
        # without stopping them (SIGKILL), they must not live on.
        die_with_parent()
    store = _run_store(environment, start_timeout)
    several = environment.world_size > 1
    if several:
        post_placement(store, environment, device)
    # Every rank posts its arrival: a rank that never comes is named, not waited on.
    Rendezvous(
        store,
        rank=environment.global_rank,
        world_size=environment.world_size,
        prefix=START_PREFIX,
    ).meet(CollectiveCall("start-up"), start_timeout)
    if several:
        # Before the backend forms a group on a layout that cannot work.
        agree_on_placement(
            store,
            environment,
            device,
            timeout=start_timeout,
            post=False,
            shared_devices=shares_devices(backend),
        )
    # gloo (the backend, or the twin that agrees on calls) must bind an address the
    # other hosts can reach.
    choose_gloo_interface(environment.main_address, environment.main_port)
    dist.init_process_group(
        backend,
        store=_group_store(environment, store, start_timeout),
        rank=environment.global_rank,
        world_size=environment.world_size,
        timeout=start_timeout,
    )
    group = dist.new_group(backend=backend, timeout=timeout)
    twin = None
    if backend != "gloo" and agreement_path(agreement, environment.world_size) == "backend":
        # Fingerprints are a few CPU integers: gloo moves them without a stream sync.
        twin = dist.new_group(backend="gloo", timeout=timeout)
    return DistributedCollectives(
        group=group,
        store=store,
        rank=environment.global_rank,
        world_size=environment.world_size,
        device=device,
        checked=checked,
        timeout=timeout,
        dimensions=dimensions,
        agreement=agreement,
        agreement_group=twin,
    )


def _run_store(environment: ClusterEnvironment, start_timeout: timedelta) -> dist.Store:
    # The job's store is kept for the life of the process and shared by every run in
    # it (a test after a fit), each run under a prefix of its own: ranks count their
    # runs alike, as they run the same program. A store made anew per run could be
    # reached, by a fast rank, while the previous one was still closing.
    key = (
        environment.main_address,
        environment.main_port,
        environment.world_size,
        environment.global_rank,
    )
    global _retained  # noqa: PLW0603 (one job store per process, kept for its life)
    if _retained is None or _retained[0] != key:
        job_store = _connect(environment, start_timeout)
        _retained = (key, _attempt_store(job_store, environment, start_timeout), itertools.count())
    _, store, runs = _retained
    run = next(runs)
    if environment.global_rank == 0:
        store.set(CURRENT_RUN_KEY, str(run))
    return dist.PrefixStore(run_prefix(run), store)


def _attempt_store(
    store: dist.Store, environment: ClusterEnvironment, start_timeout: timedelta
) -> dist.Store:
    # torchrun keeps its store across the restarts of a job: each attempt keeps its
    # keys apart, or a restarted rank would read the dead attempt's.
    if os.environ.get(_AGENT_STORE_VARIABLE) == "True" and environment.world_size > 1:
        # The agents' store outlives every attempt, and their restart counts may differ
        # (an agent that restarts because another did keeps its count): the ranks agree
        # on a round of their own.
        number = _agree_on_round(
            store, environment.global_rank, environment.world_size, start_timeout
        )
        return dist.PrefixStore(f"plait/round-{number}/", store)
    attempt = int(os.environ.get(_RESTART_VARIABLE, "0") or 0)
    return dist.PrefixStore(f"plait/attempt-{attempt}/", store) if attempt else store


def _agree_on_round(store: dist.Store, rank: int, world_size: int, start_timeout: timedelta) -> int:
    """A number every rank of this attempt shares, and no earlier attempt had.

    Rank 0 draws it from a counter in the store. Every other rank asks for it under
    a key only it can name (a new random nonce), since the keys an earlier attempt
    left in the store look like this attempt's; rank 0 answers each question it
    sees until every rank has confirmed under the new number.
    """
    if rank != 0:
        nonce = uuid.uuid4().hex
        welcome = f"{_WELCOME}{rank}/{nonce}"
        store.set(f"{_HELLO}{rank}", nonce)
        try:
            store.wait([welcome], start_timeout)
        except (RuntimeError, dist.DistError) as error:
            raise CollectiveTimeoutError(
                "start-up",
                timeout=start_timeout.total_seconds(),
                missing_ranks=[0],
                arrived_ranks=[rank],
            ) from error
        number = int(store.get(welcome))
        store.set(f"{_READY}{number}/{rank}", "1")
        return number
    number = store.add(_ROUNDS, 1)
    answered: dict[int, bytes] = {}
    waiting = list(range(1, world_size))
    deadline = time.monotonic() + start_timeout.total_seconds()
    while True:
        waiting = [other for other in waiting if not store.check([f"{_READY}{number}/{other}"])]
        if not waiting:
            return number
        for other in waiting:
            hello = f"{_HELLO}{other}"
            if store.check([hello]) and answered.get(other) != (asked := store.get(hello)):
                store.set(f"{_WELCOME}{other}/{asked.decode()}", str(number))
                answered[other] = asked
        if time.monotonic() > deadline:
            raise CollectiveTimeoutError(
                "start-up",
                timeout=start_timeout.total_seconds(),
                missing_ranks=waiting,
                arrived_ranks=[each for each in range(world_size) if each not in waiting],
            )
        time.sleep(_ROUND_POLL_INTERVAL)  # rank 0 answers questions it cannot wait for


def _group_store(
    environment: ClusterEnvironment, store: dist.Store, start_timeout: timedelta
) -> dist.TCPStore:
    # The process group gets a store of its own, on a port rank 0 picks and shares:
    # a DDP wrapper keeps its group, and the group's store, alive for the life of
    # the process, and the job's port must be free for the next run in the same
    # program (a test after a fit).
    # Rank 0 binds the port before it names it, and the store serves that very socket
    # (`_tcp_store` takes it): no other program can take the port in between.
    if environment.global_rank == 0:
        try:
            port = reserve_port(environment.main_address, every_interface=True)
        except OSError as error:
            raise _start_up_failed(environment, start_timeout) from error
        group_store = _tcp_store(environment, port, start_timeout)
        store.set(_GROUP_STORE_KEY, str(port))
        return group_store
    store.wait([_GROUP_STORE_KEY], start_timeout)
    return _tcp_store(environment, int(store.get(_GROUP_STORE_KEY)), start_timeout)


def _tcp_store(
    environment: ClusterEnvironment, port: int, start_timeout: timedelta, *, hosted: bool = False
) -> dist.TCPStore:
    serves = environment.global_rank == 0 and not hosted
    # A launcher in this process that chose the port holds it until now (`reserve_port`).
    reserved = take_reserved(port) if serves else None
    return dist.TCPStore(
        environment.main_address,
        port,
        environment.world_size,
        is_master=serves,
        timeout=start_timeout,
        wait_for_workers=False,
        master_listen_fd=None if reserved is None else reserved.detach(),
    )


def _connect(environment: ClusterEnvironment, start_timeout: timedelta) -> dist.TCPStore:
    deadline = time.monotonic() + start_timeout.total_seconds()
    while True:
        try:
            # A launcher that serves the job's store itself says so (torchrun's
            # agents do, by default): then rank 0 connects to it, as every rank does.
            hosted = (
                os.environ.get(HOSTED_STORE_VARIABLE) == "1"
                or os.environ.get(_AGENT_STORE_VARIABLE) == "True"
            )
            return _tcp_store(environment, environment.main_port, start_timeout, hosted=hosted)
        except dist.DistNetworkError as error:  # noqa: PERF203 (a retry: the error is the signal)
            # Rank 0 of a second run in one program (a test after a fit) binds the
            # port of the first run's store, which may still be closing: wait for the
            # port, as the other ranks wait to connect.
            if "EADDRINUSE" not in str(error):
                raise _start_up_failed(environment, start_timeout) from error
            if time.monotonic() > deadline:
                raise _port_in_use(environment, start_timeout) from error
            time.sleep(_BIND_RETRY_INTERVAL)
        except (RuntimeError, dist.DistError) as error:
            raise _start_up_failed(environment, start_timeout) from error


def _port_in_use(environment: ClusterEnvironment, start_timeout: timedelta) -> ConfigurationError:
    address, port = environment.main_address, environment.main_port
    return ConfigurationError(
        f"rank 0 could not serve the job's store at {address}:{port}: another program "
        f"held the port for the whole start timeout ({start_timeout.total_seconds():g} s)",
        value=port,
        fix=f"set MASTER_PORT to a port free on {address} (SLURM and LSF jobs without it use "
        "a port derived from the job id, which another job on the node may hold), or stop "
        "the program holding it",
    )


def _start_up_failed(
    environment: ClusterEnvironment, start_timeout: timedelta
) -> CollectiveTimeoutError:
    return CollectiveTimeoutError(
        "start-up",
        name=f"{environment.main_address}:{environment.main_port}",
        timeout=start_timeout.total_seconds(),
        missing_ranks=[0],
        arrived_ranks=[environment.global_rank],
    )
