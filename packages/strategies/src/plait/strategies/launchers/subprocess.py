"""Starting ranks by running the user's program again: the ``popen`` launcher."""

from __future__ import annotations

import _thread
import atexit
import collections
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Final, ParamSpec, TypeVar

from typing_extensions import override

from plait.core import ConfigurationError, PeerFailedError, free_port
from plait.strategies.launchers.children import (
    GRACE_PERIOD,
    Child,
    announce_failure,
    check_num_processes,
    launch_variables,
    stop,
    watch,
)
from plait.strategies.launchers.multiprocessing import pickled_work

__all__ = ["LAUNCHED_VARIABLE", "SubprocessScriptLauncher"]

P = ParamSpec("P")
R = TypeVar("R")

LAUNCHED_VARIABLE: Final = "PLAIT_LAUNCHED"
"""Set to ``1`` in the processes this launcher starts: they run the work, not launch it."""

_TAIL_LINES: Final = 40


def _program() -> list[str]:
    # Run the program as it was run: as a module (python -m pkg) or as a script.
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", None):
        return [sys.executable, "-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    return [sys.executable, *sys.argv]


class _Process:
    """A `subprocess.Popen` seen through the `Handle` protocol, with its stderr's tail."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        read, self._write = os.pipe()
        self.sentinel = read  # readable once the process has exited
        threading.Thread(target=self._wait, daemon=True).start()
        assert popen.stderr is not None
        self._stderr = threading.Thread(target=self._copy_stderr, args=(popen.stderr,), daemon=True)
        self._stderr.start()

    def _wait(self) -> None:
        self.popen.wait()
        os.close(self._write)

    def _copy_stderr(self, stream: IO[str]) -> None:
        # Shown as it comes, and its last lines kept for the error report.
        for line in stream:
            sys.stderr.write(line)
            self.tail.append(line)

    @property
    def pid(self) -> int | None:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def join(self, timeout: float | None = None) -> None:
        self.popen.wait(timeout)
        self._stderr.join(timeout)

    def traceback(self) -> str:
        self._stderr.join()
        return "".join(self.tail)


class _Job:
    """The ranks this process started: they run the program alongside it, to its end.

    The program runs once per rank, so every ``fit`` (or ``test``, ...) in it is
    met by the same ranks: the first launch starts them, later launches reuse them.
    A watcher thread stops them all when one fails; at exit this process waits for
    them to finish the program too.
    """

    def __init__(
        self,
        children: list[Child],
        *,
        num_processes: int,
        main_address: str,
        port: int,
        grace: float,
    ) -> None:
        self.children = children
        self.num_processes = num_processes
        self.grace = grace
        self.failures: list[PeerFailedError] = []
        self._delivered = False  # a failure was raised to rank 0's caller
        self._lock = threading.Lock()
        self._running = False
        self._watcher = threading.Thread(
            target=self._watch, args=(main_address, port), name="plait-rank-watcher", daemon=True
        )
        self._watcher.start()

    @property
    def alive(self) -> bool:
        """Whether the ranks are still running the program (none has failed)."""
        return self._watcher.is_alive() and not self.failures

    def _watch(self, main_address: str, port: int) -> None:
        try:
            watch(
                self.children,
                grace=self.grace,
                on_failure=lambda failure: announce_failure(
                    main_address, port, self.num_processes, failure
                ),
            )
        except PeerFailedError as failure:
            with self._lock:
                self.failures.append(failure)
                if self._running:
                    _thread.interrupt_main()  # rank 0 may be computing: stop it now

    def run(
        self, function: Callable[..., R], args: tuple[object, ...], kwargs: dict[str, object]
    ) -> R:
        """Run ``function`` as rank 0 while the others run it in their copy of the program."""
        if self.failures:
            self._delivered = True
            raise self.failures[0]
        try:
            with self._lock:
                self._running = True
            try:
                result = function(*args, **kwargs)
            finally:
                with self._lock:
                    self._running = False
        except BaseException as error:
            self.stop()
            if self.failures:
                self._delivered = True
                raise self.failures[0] from error
            raise
        if self.failures:
            self._delivered = True
            raise self.failures[0]
        return result

    def stop(self) -> None:
        """Stop every rank (SIGTERM, then SIGKILL after the grace period)."""
        stop(self.children, self.grace)
        self._watcher.join()

    def finish(self) -> None:
        """At exit: wait for the ranks to end the program; report a failure not yet raised."""
        self._watcher.join()
        if self.failures and not self._delivered:
            sys.stderr.write(f"plait: {self.failures[0]}\n")
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(1)  # the job failed, whatever this process's own status


_job: _Job | None = None


def _finish_job() -> None:
    if _job is not None:
        _job.finish()


class SubprocessScriptLauncher:
    """Runs the user's program again for ranks 1 to n-1; this process is rank 0.

    This is the ``popen`` way of launching: no pickling, the program simply runs
    once per rank, and each copy finds its place from the variables it was given
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...). The ranks started by the first
    launch live as long as the program: a later launch (the ``test`` after a
    ``fit``) runs with the same ranks, which reach it in their own copy of the
    program. When a rank fails, every other one is stopped (SIGTERM, then SIGKILL
    after a grace period) and rank 0 raises `PeerFailedError`; if rank 0 fails,
    the other ranks are stopped too. At exit, rank 0 waits for the others to end.

    Args:
        num_processes: How many ranks the job has, this process included.
        main_address: The rendezvous host; loopback by default.
        main_port: The rendezvous port; a free one by default.
        grace_period: Seconds between SIGTERM and SIGKILL when ranks are stopped.

    Raises:
        ConfigurationError: Fewer than one process.
    """

    def __init__(
        self,
        num_processes: int,
        *,
        main_address: str = "127.0.0.1",
        main_port: int | None = None,
        grace_period: float = GRACE_PERIOD,
    ) -> None:
        self.num_processes = check_num_processes(num_processes)
        self.main_address = main_address
        self.main_port = main_port
        self.grace_period = grace_period

    @property
    def is_interactive_compatible(self) -> bool:
        """Never: a notebook has no program to run again."""
        return False

    def launch(self, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Start the other ranks (once), run ``function`` as rank 0, and return its result.

        In a rank this launcher started, run ``function`` and nothing else.

        Raises:
            ConfigurationError: Ranks started earlier in this program form a job of
                another size.
            PeerFailedError: Another rank failed; every rank was stopped.
        """
        global _job  # noqa: PLW0603 (one job per program: its ranks run the whole program)
        if os.environ.get(LAUNCHED_VARIABLE) == "1":
            return function(*args, **kwargs)
        payload = pickled_work(function, args, kwargs)
        if _job is not None and _job.alive:
            if _job.num_processes != self.num_processes:
                raise ConfigurationError(
                    f"this program already runs a job of {_job.num_processes} processes, "
                    f"and a launch of {self.num_processes} was asked for",
                    value=self.num_processes,
                    fix="use the same number of devices for every run in one program",
                )
            job = _job
        else:
            job = self._start()
            if _job is None:
                atexit.register(_finish_job)
            _job = job
        # As in every other rank, the work is made anew once this process knows its
        # place: a strategy in it finds rank 0 of the whole job.
        function, args, kwargs = pickle.loads(payload)
        return job.run(function, args, kwargs)

    def _start(self) -> _Job:
        port = self.main_port or free_port(self.main_address)

        def variables(rank: int) -> dict[str, str]:
            return launch_variables(
                rank=rank,
                world_size=self.num_processes,
                main_address=self.main_address,
                main_port=port,
            )

        children: list[Child] = []
        try:
            for rank in range(1, self.num_processes):
                environment = {**os.environ, **variables(rank), LAUNCHED_VARIABLE: "1"}
                popen = subprocess.Popen(
                    _program(), env=environment, stderr=subprocess.PIPE, text=True
                )
                process = _Process(popen)
                children.append(Child(rank=rank, handle=process, traceback=process.traceback))
        except BaseException:
            stop(children, self.grace_period)
            raise
        os.environ.update(variables(0))
        return _Job(
            children,
            num_processes=self.num_processes,
            main_address=self.main_address,
            port=port,
            grace=self.grace_period,
        )

    @override
    def __repr__(self) -> str:
        return f"SubprocessScriptLauncher(num_processes={self.num_processes})"
