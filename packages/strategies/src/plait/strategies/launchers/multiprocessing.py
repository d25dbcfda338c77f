"""Starting ranks with torch.multiprocessing: ``spawn``, ``fork`` or ``forkserver``."""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import socket
import threading
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Final, ParamSpec, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing  # registers the reductions that share tensors
from typing_extensions import override

from plait.core import STOP_TIMEOUT, ConfigurationError, TrainingStopped, listening_socket
from plait.strategies.job import end_job, leave
from plait.strategies.launchers.children import (
    GRACE_PERIOD,
    HOSTED_STORE_VARIABLE,
    Child,
    SignalForwarder,
    announce_failure,
    check_num_processes,
    die_with_parent,
    launch_variables,
    report_fatal_signals,
    stop,
    warn_if_oversubscribed,
    watch,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext

__all__ = ["MULTIPROCESSING_METHODS", "MultiprocessingLauncher"]

P = ParamSpec("P")
R = TypeVar("R")

MULTIPROCESSING_METHODS: Final = ("spawn", "fork", "forkserver")


class _Keeping(pickle.Pickler):
    # Pickles everything but modules and tensors, which it keeps by reference.
    def __init__(self, file: io.BytesIO, kept: dict[int, object]) -> None:
        super().__init__(file)
        self.kept = kept

    @override
    def persistent_id(self, obj: object) -> int | None:
        if isinstance(obj, torch.nn.Module | torch.Tensor):
            self.kept[id(obj)] = obj
            return id(obj)
        return None


class _Unkeeping(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, kept: dict[int, object]) -> None:
        super().__init__(file)
        self.kept = kept

    @override
    def persistent_load(self, pid: object) -> object:
        assert isinstance(pid, int)
        return self.kept[pid]


def pickled_work(
    function: Callable[..., object],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    *,
    keep_modules: dict[int, object] | None = None,
) -> bytes:
    """The function and its arguments, pickled to reach the ranks.

    With ``keep_modules`` (for work that stays in this process), modules and tensors
    are not pickled: they are kept there, by reference, for `unpickled_work`. The
    work is made anew around the caller's own modules and data, never copies of them.

    Raises:
        ConfigurationError: They cannot be pickled.
    """
    try:
        if keep_modules is None:
            return pickle.dumps((function, args, kwargs))
        buffer = io.BytesIO()
        _Keeping(buffer, keep_modules).dump((function, args, kwargs))
        return buffer.getvalue()
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise ConfigurationError(
            f"the function {getattr(function, '__qualname__', function)!r} and its arguments "
            f"cannot be sent to the ranks: {error}",
            value=function,
            fix="define the function at the top level of a module and pass picklable "
            "arguments (no lambdas, local functions or open files)",
        ) from error


def unpickled_work(
    payload: bytes, kept: dict[int, object]
) -> tuple[Callable[..., object], tuple[object, ...], dict[str, object]]:
    """The work `pickled_work` pickled keeping modules: made anew, around the same objects."""
    return _Unkeeping(io.BytesIO(payload), kept).load()  # type: ignore[no-any-return]


def _context(method: str) -> SpawnContext | ForkContext | ForkServerContext:
    if method == "fork":
        return multiprocessing.get_context("fork")
    if method == "forkserver":
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


def _run_rank(
    results: Connection,
    variables: dict[str, str],
    work: Connection,
    fresh: bool,
    inherited: int | None,
) -> None:
    # The body of each child: learn its place, then receive and unpickle the work
    # (so strategies in it are made anew for this rank), run, report the result or
    # the error. The job ends with the child: after success its group is destroyed
    # here, and a fresh interpreter (spawn, forkserver) leaves without being torn
    # down (`leave`); a forked one always leaves so (multiprocessing's own exit).
    # ``inherited``: the launcher's listening socket, which a forked child holds too.
    if inherited is not None:
        os.close(inherited)
    die_with_parent()
    report_fatal_signals()
    os.environ.update(variables)
    try:
        function, args, kwargs = pickle.loads(work.recv_bytes())
        work.close()
        result = function(*args, **kwargs)
    except TrainingStopped as stopped:  # a graceful stop, with its own exit status
        results.send_bytes(pickle.dumps(("stopped", stopped)))
        raise
    except BaseException:  # noqa: BLE001 (every failure is reported, then exits 1)
        results.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        raise SystemExit(1) from None
    # Plain pickling copies tensors into the message: torch's shared-memory reductions
    # would leave the parent a handle to fetch from a process that has exited.
    results.send_bytes(pickle.dumps(("result", result if variables["RANK"] == "0" else None)))
    results.close()
    end_job()
    if fresh:
        leave(0)


def _listen(address: str, port: int | None) -> socket.socket:
    # The job store's socket, bound before any rank starts: the port is the job's
    # from the first moment, and ranks that connect before the store serves wait in
    # its backlog.
    try:
        return listening_socket(address, port)
    except socket.gaierror as error:
        raise ConfigurationError(
            f"main_address={address!r} cannot be served here: {error}",
            value=address,
            fix="use an address of this machine, e.g. the default '127.0.0.1'",
        ) from error
    except OSError as error:
        raise ConfigurationError(
            f"the job's store cannot listen on {address}:{port or 0}: {error}",
            value=port,
            fix="leave main_port unset, so that a free port is chosen, or stop the "
            "program that holds it",
        ) from error


def _send_work(connection: Connection, payload: bytes) -> None:
    # A child reads its work only once it has started (under spawn, once it has
    # imported the main module again); sent from a thread, a large payload neither
    # holds up the start of the next child nor the watch over the started ones.
    def send() -> None:
        try:
            connection.send_bytes(payload)
        except OSError:
            pass  # the child died first: the watch reports it
        finally:
            connection.close()

    threading.Thread(target=send, daemon=True).start()


class _Inbox:
    """Reads one child's messages as they come, so a large result never blocks it."""

    def __init__(self, connection: Connection) -> None:
        self.messages: list[tuple[str, object]] = []
        self.failure: BaseException | None = None
        self._connection = connection
        self._thread = threading.Thread(target=self._drain, daemon=True)

    def start(self) -> None:
        """Start reading (in a thread of its own)."""
        self._thread.start()

    def _drain(self) -> None:
        try:
            while True:
                self.messages.append(pickle.loads(self._connection.recv_bytes()))
        except (EOFError, OSError):
            pass  # the child closed its end: it has exited
        except Exception as error:  # noqa: BLE001 (kept, and raised by read())
            self.failure = error

    def read(self, kind: str) -> object:
        self._thread.join()
        if self.failure is not None:
            raise RuntimeError(f"a rank's message could not be read: {self.failure}") from (
                self.failure
            )
        return next((body for got, body in self.messages if got == kind), None)

    def traceback(self) -> str:
        text = self.read("error")
        return text if isinstance(text, str) else ""


class MultiprocessingLauncher:
    """Runs a function in ``num_processes`` new processes, one per rank, on this machine.

    Each process gets the variables a launched rank reads (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) before the function runs, so a
    strategy made inside it finds its place. Rank 0's return value comes back to
    the caller. When a rank fails, the others are told through the job's store, which
    this process serves (so it outlives any rank), get a grace period to exit, and are
    then killed; the caller gets `PeerFailedError` naming the root cause: the rank
    that failed first for a reason of its own, or the rank that stalled while the
    others timed out waiting for it. Ranks die with the launcher, whatever kills it.
    SIGTERM and SIGUSR1 sent to this process are passed on to the ranks: training
    ranks stop gracefully together, and the caller gets their `TrainingStopped`.

    The function and its arguments are pickled for every start method, before any
    process starts: a strategy among them is made anew in each rank (see
    `ParallelStrategy`). ``fork`` also works in notebooks, before CUDA is initialised.

    Args:
        num_processes: How many ranks to start.
        start_method: ``"spawn"``, ``"fork"`` or ``"forkserver"``.
        main_address: The rendezvous host; loopback by default.
        main_port: The rendezvous port; by default, one the operating system picks
            when the job's store starts listening, before any rank starts.
        grace_period: Seconds between SIGTERM and SIGKILL when ranks are stopped.
        stop_timeout: Seconds a graceful stop may take: the ranks still running this
            long (and ``grace_period``) after a stop signal was passed on are killed.
            The `Trainer` sets it to its own ``stop_timeout``; ``None``: no bound.

    Raises:
        ConfigurationError: Fewer than one process, or a start method this platform
            lacks.
    """

    def __init__(
        self,
        num_processes: int,
        *,
        start_method: str = "spawn",
        main_address: str = "127.0.0.1",
        main_port: int | None = None,
        grace_period: float = GRACE_PERIOD,
        stop_timeout: float | None = STOP_TIMEOUT,
    ) -> None:
        available = [
            method
            for method in MULTIPROCESSING_METHODS
            if method in multiprocessing.get_all_start_methods()
        ]
        if start_method not in available:
            raise ConfigurationError.invalid_choice("start_method", start_method, available)
        self.num_processes = check_num_processes(num_processes)
        self.start_method = start_method
        self.main_address = main_address
        self.main_port = main_port
        self.grace_period = grace_period
        self.stop_timeout = stop_timeout

    @property
    def is_interactive_compatible(self) -> bool:
        """Only ``fork`` works where ``__main__`` cannot be re-imported (notebooks)."""
        return self.start_method == "fork"

    def launch(self, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``function(*args, **kwargs)`` on every rank; return rank 0's result.

        Raises:
            ConfigurationError: The function or its arguments cannot be pickled, or
                the job's store cannot listen at ``main_address``:``main_port``.
            PeerFailedError: A rank failed or stalled; every rank was stopped.
            TrainingStopped: A stop signal came, and every rank stopped gracefully.
        """
        payload = pickled_work(function, args, kwargs)
        context = _context(self.start_method)
        listener = _listen(self.main_address, self.main_port)
        warn_if_oversubscribed(self.num_processes)
        children: list[Child] = []
        forwarder = SignalForwarder(
            lambda: children,
            exit_after=False,
            stop_timeout=lambda: self.stop_timeout,
            grace=self.grace_period,
        )
        forwarder.install()
        try:
            result = self._run(context, listener=listener, payload=payload, children=children)
        finally:
            forwarder.uninstall()
            listener.close()  # unless the store took it
        return result  # type: ignore[return-value]

    def _run(
        self,
        context: SpawnContext | ForkContext | ForkServerContext,
        *,
        listener: socket.socket,
        payload: bytes,
        children: list[Child],
    ) -> object:
        port = int(listener.getsockname()[1])
        forks = self.start_method == "fork"
        inboxes: list[_Inbox] = []
        works: list[Connection] = []
        try:
            for rank in range(self.num_processes):
                receive, send = context.Pipe(duplex=False)
                work_receive, work_send = context.Pipe(duplex=False)
                variables = launch_variables(
                    rank=rank,
                    world_size=self.num_processes,
                    main_address=self.main_address,
                    main_port=port,
                )
                variables[HOSTED_STORE_VARIABLE] = "1"
                process = context.Process(
                    target=_run_rank,
                    args=(
                        send,
                        variables,
                        work_receive,
                        not forks,
                        listener.fileno() if forks else None,
                    ),
                    name=f"plait-rank-{rank}",
                )
                process.start()
                send.close()
                work_receive.close()
                inbox = _Inbox(receive)
                inboxes.append(inbox)
                works.append(work_send)
                children.append(Child(rank=rank, handle=process, traceback=inbox.traceback))
            # Only now, with every rank started, does this process run threads of its
            # own: the store's, and those that send the work and read the results. A
            # rank forked while one of them held a lock of the C library (the store's
            # takes the resolver's to name each peer that connects) would wait on it
            # for ever, the first time it resolved an address itself.
            # The job's store lives here, not in rank 0: a failure of any rank can be
            # posted to the others at once, and none waits on a store that died.
            store = dist.TCPStore(
                self.main_address,
                port,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=30),
                master_listen_fd=listener.detach(),
            )
            for inbox, work in zip(inboxes, works, strict=True):
                _send_work(work, payload)
                inbox.start()
        except BaseException:
            stop(children, self.grace_period)
            raise
        stops = watch(
            children,
            grace=self.grace_period,
            on_failure=lambda failure: announce_failure(
                self.main_address, port, self.num_processes, failure, store=store
            ),
        )
        if stops:
            stopped = inboxes[0].read("stopped")
            raise stopped if isinstance(stopped, TrainingStopped) else TrainingStopped(stops[0])
        return inboxes[0].read("result")

    @override
    def __repr__(self) -> str:
        return (
            f"MultiprocessingLauncher(num_processes={self.num_processes}, "
            f"start_method={self.start_method!r})"
        )
