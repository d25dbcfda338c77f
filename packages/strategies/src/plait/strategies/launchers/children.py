"""Watching child processes: the first failure stops all of them, and is reported."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from multiprocessing.connection import wait
from types import FrameType
from typing import TYPE_CHECKING, Final, Protocol, cast

import attrs
import torch.distributed as dist

from plait.core import ConfigurationError, PeerFailedError, stopped_by
from plait.strategies.failures import post_failure
from plait.strategies.store import START_PREFIX, STORE_PREFIX

if TYPE_CHECKING:
    from plait.core.typing import SignalHandler

__all__ = [
    "GRACE_PERIOD",
    "HOSTED_STORE_VARIABLE",
    "Child",
    "Exit",
    "SignalForwarder",
    "announce_failure",
    "check_num_processes",
    "diagnose",
    "die_with_parent",
    "is_consequence",
    "kill",
    "launch_variables",
    "lost_peer",
    "setting_variables",
    "stop",
    "timeout_of",
    "warn_if_oversubscribed",
    "watch",
]

HOSTED_STORE_VARIABLE: Final = "PLAIT_HOSTED_STORE"
"""Set to ``1`` for ranks whose job store the launcher serves: rank 0 only connects to it."""

GRACE_PERIOD: Final = 5.0
"""Seconds the other ranks get to exit on their own after a failure, before SIGKILL."""

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


@contextlib.contextmanager
def setting_variables(variables: Mapping[str, str]) -> Iterator[None]:
    """Set ``variables`` in this process's environment while the block runs.

    The values they had (or their absence) come back after, so that a process the
    program starts later does not inherit a launch's place in a job.
    """
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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


def warn_if_oversubscribed(num_processes: int) -> None:
    """Say, before starting them, that more ranks than CPU cores will start slowly."""
    cores = os.cpu_count() or 1
    if num_processes > cores:
        sys.stderr.write(
            f"plait: starting {num_processes} processes on {cores} CPU cores: each imports "
            "torch and joins the process group, so start-up takes a while and every step "
            "is slower; use at most one process per core (devices=...) unless you mean it\n"
        )
        sys.stderr.flush()


def announce_failure(
    main_address: str,
    main_port: int,
    world_size: int,
    failure: PeerFailedError,
    *,
    store: dist.Store | None = None,
    timeout: float = 5.0,
) -> None:
    """Post ``failure`` to the job's store, so that the surviving ranks raise it.

    ``store`` is the job's store when this process serves it; otherwise it is
    reached at the address. Nothing happens when it is gone (its host has died).
    """
    try:
        if store is None:
            store = dist.TCPStore(
                main_address, main_port, is_master=False, timeout=timedelta(seconds=timeout)
            )
        post_failure(store, failure, world_size=world_size, prefixes=(STORE_PREFIX, START_PREFIX))
    except (RuntimeError, dist.DistError):
        pass  # no store to tell: the ranks see the dead peer in their next collective


def die_with_parent(parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux).

    A launcher killed with SIGKILL can run no clean-up; this leaves no orphan. The
    signal is SIGKILL, not SIGTERM: a training rank takes SIGTERM as a request to
    stop gracefully, which cannot be honoured once the job's launcher is gone.

    Args:
        parent: The pid the parent had when this process started, if known; if
            the parent is already another process, it died before this call.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    current = os.getppid()
    if current == 1 or (parent is not None and current != parent):
        os.kill(os.getpid(), signal.SIGKILL)  # the parent died before prctl took effect


def report_fatal_signals() -> None:
    """Have this rank print every thread's Python stack if a fatal signal ends it.

    A rank killed from inside native code (``SIGSEGV``, or ``SIGABRT`` from a C++
    ``std::terminate``) would otherwise leave only its exit code: with the stacks on
    its standard error, the launcher's report says where it was. Nothing changes
    while the rank runs, and a handler the user enabled is kept.
    """
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)


def stop(children: Sequence[Child], grace: float = GRACE_PERIOD) -> None:
    """Send SIGTERM to the children still running, SIGKILL after ``grace`` seconds; reap all.

    Ranks inside `Trainer.fit` take SIGTERM as a request to stop gracefully, which
    they cannot honour while another rank is gone: they get SIGKILL after ``grace``.
    """
    alive = [child for child in children if child.handle.exitcode is None]
    for child in alive:
        if child.handle.pid is not None:
            _signal(child.handle.pid, signal.SIGTERM)
    kill(children, grace)


def kill(children: Sequence[Child], grace: float = 0.0) -> list[int]:
    """Wait up to ``grace`` seconds for the children to exit, SIGKILL the rest; reap all.

    Returns:
        The ranks that had to be killed, sorted.
    """
    remaining = {
        child.handle.sentinel: child for child in children if child.handle.exitcode is None
    }
    _exits(remaining, grace)
    for child in remaining.values():
        if child.handle.pid is not None:
            _signal(child.handle.pid, signal.SIGKILL)
    for child in children:
        child.handle.join()
    return sorted(child.rank for child in remaining.values())


def _exits(pending: dict[int, Child], grace: float) -> list[Child]:
    # Wait (up to ``grace``) for the children to exit by themselves; those that did.
    deadline = time.monotonic() + grace
    exited = []
    while pending and (left := deadline - time.monotonic()) > 0:
        for sentinel in _ready(list(pending), left):
            child = pending.pop(sentinel)
            child.handle.join()
            exited.append(child)
    return exited


def _ready(sentinels: list[int], timeout: float | None) -> list[int]:
    # wait() hands back the very objects it was given: here, the sentinels.
    return [cast("int", ready) for ready in wait(sentinels, timeout=timeout)]


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has exited already
        os.kill(pid, signum)


_LOST_PEER = re.compile(
    r"PeerFailedError|Connection closed by peer|Connection reset by peer|Broken pipe"
    r"|DistNetworkError"
)
"""What an error says when another rank is gone."""
_CONSEQUENCE = re.compile(
    _LOST_PEER.pattern
    + r"|CollectiveTimeoutError|Timed out|timed out|KeyboardInterrupt|TrainingStopped"
)
"""What a rank's error says when it only reacts to another rank's failure or stall."""
_TIMEOUT = re.compile(r"timed out after ([\d.]+) s|Timed out waiting (\d+)ms")


def is_consequence(tail: str) -> bool:
    """Whether a failed rank's error only reports another rank's failure or stall."""
    return _CONSEQUENCE.search(tail) is not None


def lost_peer(text: str) -> bool:
    """Whether an error says another rank is gone (a closed connection, a posted failure)."""
    return _LOST_PEER.search(text) is not None


def timeout_of(text: str) -> float | None:
    """The collective timeout a rank's error reports, in seconds, if it is a timeout."""
    found = _TIMEOUT.search(text)
    if found is None:
        return None
    seconds, milliseconds = found.groups()
    return float(seconds) if seconds is not None else int(milliseconds) / 1000


@attrs.frozen
class Exit:
    """How one rank ended.

    Attributes:
        rank: Its global rank.
        exit_code: Its exit code (negative: the signal that killed it).
        tail: The end of its error output.
    """

    rank: int
    exit_code: int | None
    tail: str


def diagnose(
    failed: Sequence[Exit], stalled: Sequence[int] = (), killed: Sequence[int] = ()
) -> PeerFailedError:
    """The failure to report for a job, from every rank that failed and every one that stalled.

    ``failed`` lists the ranks that exited with an error, first failure first;
    ``stalled`` the ranks that were still running ``grace`` seconds after it (they
    were then stopped; ``killed``: those of them that were killed). When the first
    failure is a timeout and a rank was still running, that rank stalled: the
    others timed out waiting for it. Otherwise the root cause is the first rank
    whose error is not only a reaction to another's (a lost connection, a timeout,
    a peer's failure), or else the first failure.
    """
    first = failed[0]
    waited = timeout_of(first.tail)
    if waited is not None and stalled:
        waiters = [e.rank for e in failed if timeout_of(e.tail) is not None]
        rank = min(stalled)
        # A rank in this process (rank 0 under popen) is interrupted, not killed.
        code = -signal.SIGKILL if rank in killed else None
        return PeerFailedError(rank, code, waited_by=waiters, stalled_for=waited)
    root = next((e for e in failed if not is_consequence(e.tail)), first)
    return PeerFailedError(root.rank, root.exit_code, root.tail)


def watch(
    children: Sequence[Child],
    *,
    grace: float = GRACE_PERIOD,
    on_failure: Callable[[PeerFailedError], None] | None = None,
    others_running: Callable[[float], list[int]] | None = None,
) -> list[signal.Signals]:
    """Wait until every child has exited; stop all of them at the first failure.

    A child that exits with a graceful-stop status (`plait.core.stopped_by`) has not
    failed. At the first failure, ``on_failure`` is called with it (to tell the
    surviving ranks, which then raise it themselves); the others get up to
    ``grace`` seconds to exit on their own, and are then killed. The error raised
    names the root cause among every rank that failed meanwhile (see `diagnose`).
    ``others_running``, given the time left of the grace, tells which ranks outside
    ``children`` (rank 0 in this process) are still running at its end.

    Returns:
        The signals of the children that stopped gracefully, if any did.

    Raises:
        PeerFailedError: A child failed (or stalled); every child was stopped.
    """
    pending = {child.handle.sentinel: child for child in children}
    stops: list[signal.Signals] = []
    try:
        while pending:
            for sentinel in _ready(list(pending), None):
                child = pending.pop(sentinel)
                child.handle.join()
                code = child.handle.exitcode
                stopped = stopped_by(code)
                if stopped is not None:
                    stops.append(stopped)
                elif code != 0:
                    _fail(child, pending, grace, on_failure, others_running)
    except BaseException:
        stop(children, grace)  # interrupted, or a failure: leave nothing behind
        raise
    return stops


def _fail(
    child: Child,
    pending: dict[int, Child],
    grace: float,
    on_failure: Callable[[PeerFailedError], None] | None,
    others_running: Callable[[float], list[int]] | None,
) -> None:
    first = Exit(child.rank, child.handle.exitcode, child.traceback())
    if on_failure is not None:
        on_failure(PeerFailedError(first.rank, first.exit_code, first.tail))
    started = time.monotonic()
    failed = [first]
    for other in _exits(pending, grace):
        code = other.handle.exitcode
        if code != 0 and stopped_by(code) is None:
            failed.append(Exit(other.rank, code, other.traceback()))
    running = sorted(c.rank for c in pending.values())
    if others_running is not None:
        running = sorted([*running, *others_running(grace - (time.monotonic() - started))])
    killed = kill(list(pending.values()))
    pending.clear()
    raise diagnose(failed, running, killed)


class SignalForwarder:
    """Passes the stop signals this process receives on to the ranks it started.

    A scheduler that pre-empts a job signals the process it knows, the launcher;
    each rank must hear it too, to stop at the same batch as the others and save.
    Installed for SIGTERM and SIGUSR1 while the ranks run (main thread only). When
    nothing else in this process handles the signal (``exit_after``), the process
    then ends as the signal's default action would have ended it.

    A rank must end within ``stop_timeout`` and ``grace`` seconds of the first signal
    passed on: the ranks bound their own graceful stop, but one stuck in native code
    (a deadlock in OpenMP after a fork, a hung driver call) never runs Python's signal
    handlers. Those still running then are killed (SIGKILL), saying so.

    Args:
        children: Returns the ranks to pass signals on to.
        exit_after: Whether to end this process after passing a signal on, when no
            handler was installed over this one.
        stop_timeout: Returns the seconds a graceful stop may take (read when the
            signal comes); ``None``: the ranks are never killed for taking longer.
        grace: Seconds more before the ranks still running are killed.
    """

    SIGNALS: Final = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(
        self,
        children: Callable[[], Sequence[Child]],
        *,
        exit_after: bool,
        stop_timeout: Callable[[], float | None] = lambda: None,
        grace: float = GRACE_PERIOD,
    ) -> None:
        self._children = children
        self._exit_after = exit_after
        self._stop_timeout = stop_timeout
        self._grace = grace
        self._previous: dict[int, SignalHandler] = {}
        self._deadline: threading.Timer | None = None

    def install(self) -> None:
        """Take over the signals (nothing happens outside the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self)

    def uninstall(self) -> None:
        """Give the signals back to the handlers they had (and kill no rank later)."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        """Pass ``signum`` on to every running rank, then to the previous handler."""
        for child in self._children():
            if child.handle.exitcode is None and child.handle.pid is not None:
                _signal(child.handle.pid, signum)
        stop_timeout = self._stop_timeout()
        if self._deadline is None and stop_timeout is not None:
            bound = stop_timeout + self._grace
            self._deadline = threading.Timer(bound, self._kill_stuck, (signum, bound))
            self._deadline.daemon = True
            self._deadline.start()
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif self._exit_after and signal.getsignal(signum) is self:
            # Nothing in this process asked for the signal: it ends the process.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _kill_stuck(self, signum: int, bound: float) -> None:
        stuck = [
            child
            for child in self._children()
            if child.handle.exitcode is None and child.handle.pid is not None
        ]
        if not stuck:
            return
        ranks = ", ".join(str(child.rank) for child in stuck)
        sys.stderr.write(
            f"plait: rank{'s' if len(stuck) > 1 else ''} {ranks} did not end within "
            f"{bound:g} s of {signal.Signals(signum).name} (the stop timeout and the "
            "grace period; stuck outside Python?): killed with SIGKILL\n"
        )
        sys.stderr.flush()
        for child in stuck:
            if child.handle.pid is not None:
                _signal(child.handle.pid, signal.SIGKILL)
