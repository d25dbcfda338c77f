"""Watching child processes: the first failure stops all of them, and is reported."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Final, Protocol, cast

import attrs
import torch.distributed as dist

from plait.core import ConfigurationError, PeerFailedError
from plait.strategies.collectives import START_PREFIX, STORE_PREFIX, post_failure

__all__ = [
    "GRACE_PERIOD",
    "Child",
    "announce_failure",
    "check_num_processes",
    "die_with_parent",
    "launch_variables",
    "stop",
    "watch",
]

GRACE_PERIOD: Final = 5.0
"""Seconds between SIGTERM and SIGKILL when the other children are stopped."""

_PR_SET_PDEATHSIG: Final = 1


class Handle(Protocol):
    """What is needed of a child process: its pid, its exit code, and a sentinel."""

    @property
    def pid(self) -> int | None: ...

    @property
    def sentinel(self) -> int: ...

    @property
    def exitcode(self) -> int | None: ...

    def join(self, timeout: float | None = None) -> None: ...


@attrs.frozen
class Child:
    """One launched rank.

    Attributes:
        rank: Its global rank.
        handle: The process.
        traceback: Reads the tail of what it reported on failure (may be empty).
    """

    rank: int
    handle: Handle
    traceback: Callable[[], str]


def check_num_processes(num_processes: object) -> int:
    """``num_processes`` if it is an int of at least 1.

    Raises:
        ConfigurationError: It is not.
    """
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ConfigurationError(
            f"num_processes={num_processes!r} must be an int of at least 1",
            value=num_processes,
            fix="pass the number of ranks to start, e.g. num_processes=2",
        )
    return num_processes


def launch_variables(
    *, rank: int, world_size: int, main_address: str, main_port: int
) -> dict[str, str]:
    """The variables a launched rank reads its place from (as torchrun's children do)."""
    return {
        "MASTER_ADDR": main_address,
        "MASTER_PORT": str(main_port),
        "WORLD_SIZE": str(world_size),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "NODE_RANK": "0",
    }


def announce_failure(
    main_address: str, main_port: int, world_size: int, failure: PeerFailedError
) -> None:
    """Post ``failure`` to the job's store, so that the surviving ranks raise it.

    Nothing happens when the store is gone (rank 0, which holds it, has died).
    """
    try:
        store = dist.TCPStore(
            main_address, main_port, is_master=False, timeout=timedelta(seconds=5)
        )
        post_failure(store, failure, world_size=world_size, prefixes=(STORE_PREFIX, START_PREFIX))
    except (RuntimeError, dist.DistError):
        pass  # no store to tell: the ranks see the dead peer in their next collective


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux).

    A launcher killed with SIGKILL can run no clean-up; this leaves no orphan.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def stop(children: Sequence[Child], grace: float = GRACE_PERIOD) -> None:
    """Send SIGTERM to the children still running, SIGKILL after ``grace`` seconds; reap all."""
    alive = [child for child in children if child.handle.exitcode is None]
    for child in alive:
        if child.handle.pid is not None:
            _signal(child.handle.pid, signal.SIGTERM)
    remaining = {child.handle.sentinel: child for child in alive}
    for sentinel in _ready(list(remaining), grace) if remaining else []:
        remaining.pop(sentinel)
    for child in remaining.values():
        if child.handle.pid is not None:
            _signal(child.handle.pid, signal.SIGKILL)
    for child in children:
        child.handle.join()


def _exits(pending: dict[int, Child], grace: float) -> None:
    # The survivors were told: wait (up to ``grace``) for them to exit by themselves.
    deadline = time.monotonic() + grace
    while pending and (left := deadline - time.monotonic()) > 0:
        for sentinel in _ready(list(pending), left):
            pending.pop(sentinel).handle.join()


def _ready(sentinels: list[int], timeout: float | None) -> list[int]:
    # wait() hands back the very objects it was given: here, the sentinels.
    return [cast("int", ready) for ready in wait(sentinels, timeout=timeout)]


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has exited already
        os.kill(pid, signum)


def watch(
    children: Sequence[Child],
    *,
    grace: float = GRACE_PERIOD,
    on_failure: Callable[[PeerFailedError], None] | None = None,
) -> None:
    """Wait until every child has exited; stop all of them at the first failure.

    ``on_failure`` is called with the failure first (to tell the surviving ranks,
    which then raise it themselves); the others get up to ``grace`` seconds to exit
    on their own before they are stopped.

    Raises:
        PeerFailedError: A child exited with a non-zero code (or was killed); the
            others were sent SIGTERM, then SIGKILL after ``grace`` seconds.
    """
    pending = {child.handle.sentinel: child for child in children}
    try:
        while pending:
            for sentinel in _ready(list(pending), None):
                child = pending.pop(sentinel)
                child.handle.join()
                code = child.handle.exitcode
                if code != 0:
                    failure = PeerFailedError(child.rank, code, child.traceback())
                    if on_failure is not None:
                        on_failure(failure)
                        _exits(pending, grace)
                    stop(children, grace)
                    raise failure
    except BaseException:
        stop(children, grace)  # interrupted, or a failure: leave nothing behind
        raise
