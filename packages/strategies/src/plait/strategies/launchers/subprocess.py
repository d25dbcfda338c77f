"""Starting ranks by running the user's program again: the ``popen`` launcher."""

from __future__ import annotations

import _thread
import collections
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Final, ParamSpec, TypeVar

from typing_extensions import override

from plait.core import PeerFailedError, free_port
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


class SubprocessScriptLauncher:
    """Runs the user's program again for ranks 1 to n-1; this process is rank 0.

    This is the ``popen`` way of launching: no pickling, the program simply runs
    once per rank, and each copy finds its place from the variables it was given
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...). When a rank fails, every other
    one is stopped (SIGTERM, then SIGKILL after a grace period) and rank 0 raises
    `PeerFailedError`; if rank 0 fails, the other ranks are stopped too.

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
        """Start the other ranks, run ``function`` as rank 0, and return its result.

        In a rank this launcher started, run ``function`` and nothing else.

        Raises:
            PeerFailedError: Another rank failed; every rank was stopped.
        """
        if os.environ.get(LAUNCHED_VARIABLE) == "1":
            return function(*args, **kwargs)
        port = self.main_port or free_port(self.main_address)

        def variables(rank: int) -> dict[str, str]:
            return launch_variables(
                rank=rank,
                world_size=self.num_processes,
                main_address=self.main_address,
                main_port=port,
            )

        payload = pickled_work(function, args, kwargs)
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
        # As in every other rank, the work is made anew once this process knows its
        # place: a strategy in it finds rank 0 of the whole job.
        function, args, kwargs = pickle.loads(payload)
        return self._run_as_rank_zero(children, port, function, args, kwargs)

    def _run_as_rank_zero(
        self,
        children: list[Child],
        port: int,
        function: Callable[..., R],
        args: tuple[object, ...],
        kwargs: dict[str, object],
    ) -> R:
        failures: list[PeerFailedError] = []
        lock = threading.Lock()
        running = [True]

        def watch_children() -> None:
            try:
                watch(
                    children,
                    grace=self.grace_period,
                    on_failure=lambda failure: announce_failure(
                        self.main_address, port, self.num_processes, failure
                    ),
                )
            except PeerFailedError as failure:
                with lock:
                    failures.append(failure)
                    if running[0]:
                        _thread.interrupt_main()  # rank 0 may be computing: stop it now

        watcher = threading.Thread(target=watch_children, daemon=True)
        watcher.start()
        try:
            try:
                result = function(*args, **kwargs)
            finally:
                with lock:
                    running[0] = False
            watcher.join()  # the other ranks finish too
        except BaseException as error:
            stop(children, self.grace_period)
            watcher.join()
            if failures:
                raise failures[0] from error
            raise
        if failures:
            raise failures[0]
        return result

    @override
    def __repr__(self) -> str:
        return f"SubprocessScriptLauncher(num_processes={self.num_processes})"
