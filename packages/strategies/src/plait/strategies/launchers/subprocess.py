"""Starting ranks by running the user's program again: the ``popen`` launcher."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Final, ParamSpec, TypeVar, cast

from typing_extensions import override

from plait.core import (
    STOP_TIMEOUT,
    ConfigurationError,
    PeerFailedError,
    TrainingStopped,
    release_reserved,
    reserve_port,
    stopped_by,
)
from plait.strategies.job import end_job
from plait.strategies.launchers.children import (
    GRACE_PERIOD,
    Child,
    SignalForwarder,
    announce_failure,
    check_num_processes,
    die_with_parent,
    kill,
    launch_variables,
    lost_peer,
    report_fatal_signals,
    setting_variables,
    stop,
    timeout_of,
    warn_if_oversubscribed,
    watch,
)
from plait.strategies.launchers.hydra_app import HydraRun, current_hydra_run
from plait.strategies.launchers.multiprocessing import pickled_work, unpickled_work

__all__ = [
    "ERROR_FILE_VARIABLE",
    "LAUNCHED_VARIABLE",
    "SubprocessScriptLauncher",
    "become_rank",
    "end_a_finished_hydra_job",
    "leads_a_job",
]

P = ParamSpec("P")
R = TypeVar("R")

LAUNCHED_VARIABLE: Final = "PLAIT_LAUNCHED"
"""Set to ``1`` in the processes this launcher starts: they run the work, not launch it."""

ERROR_FILE_VARIABLE: Final = "PLAIT_ERROR_FILE"
"""Where a started rank writes its uncaught error, for the launcher's report."""

PARENT_VARIABLE: Final = "PLAIT_LAUNCHER_PID"
"""The launcher's pid, as a started rank's parent."""

_TAIL_LINES: Final = 40
_SETTLE: Final = 1.0
"""Seconds the other ranks get to exit by themselves after rank 0's own failure."""

_VERDICT: Final = 15.0
"""Seconds rank 0 waits for the watcher's verdict when its own error says another rank
is gone: the verdict comes once the failed rank has exited, which a loaded machine can
take longer than the grace period for."""


def _program(rank: int) -> tuple[list[str], str | None]:
    """The command that runs the program again as ``rank``, and the folder to run it in.

    As it was run: as a module (``python -m pkg``) or as a script. A Hydra app's
    rank repeats this job, in this run's folder (`plait.strategies.launchers.hydra_app`),
    from the folder the program was started in.
    """
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    module = spec.name.removesuffix(".__main__") if spec is not None else "__main__"
    hydra = current_hydra_run()
    if module != "__main__":
        program = [sys.executable, "-m", module]
    elif hydra is not None:  # a script's path as given, from where the program started
        program = [sys.executable, os.path.join(hydra.original_cwd, sys.argv[0])]
    else:
        program = [sys.executable, sys.argv[0]]
    if hydra is None:
        return [*program, *sys.argv[1:]], None
    return hydra.command(program, sys.argv[1:], rank), hydra.original_cwd


def _write_error_file(
    kind: type[BaseException], error: BaseException, tb: TracebackType | None
) -> None:
    # A launched rank's uncaught error, for the launcher's report (its stderr goes
    # straight to the terminal, so that nothing is lost if the launcher dies).
    path = os.environ.get(ERROR_FILE_VARIABLE)
    if path and stopped_by(getattr(error, "code", None)) is None:
        with contextlib.suppress(OSError):
            Path(path).write_text("".join(traceback.format_exception(kind, error, tb)))


def _report_errors() -> None:
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        _write_error_file(kind, error, tb)
        previous(kind, error, tb)

    sys.excepthook = hook


class _Process:
    """A `subprocess.Popen` seen through the `Handle` protocol, with its error's tail."""

    def __init__(self, popen: subprocess.Popen[bytes], error_file: Path) -> None:
        self.popen = popen
        self.error_file = error_file
        read, self._write = os.pipe()
        self.sentinel = read  # readable once the process has exited
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        self.popen.wait()
        os.close(self._write)

    @property
    def pid(self) -> int | None:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def join(self, timeout: float | None = None) -> None:
        self.popen.wait(timeout)

    def traceback(self) -> str:
        try:
            lines = self.error_file.read_text().splitlines()
        except OSError:
            return ""  # killed, or exited without an uncaught error
        return "\n".join(lines[-_TAIL_LINES:])


class _Job:
    """The ranks this process started: they run the program alongside it, to its end.

    The program runs once per rank, so every ``fit`` (or ``test``, ...) in it is
    met by the same ranks: the first launch starts them, later launches reuse them.
    A watcher thread stops them all when one fails, and interrupts this process (rank
    0) if it is still running; at exit this process waits for them to finish the
    program too. Rank 0's own error is raised as it is: the other ranks' reactions
    to it (lost connections) are not reported in its place.
    """

    def __init__(
        self,
        children: list[Child],
        *,
        num_processes: int,
        main_address: str,
        port: int,
        grace: float,
        errors: tempfile.TemporaryDirectory[str],
        stop_timeout: Callable[[], float | None],
        hydra_run: HydraRun | None = None,
        saved_variables: dict[str, str | None] | None = None,
    ) -> None:
        self.children = children
        self.hydra_run = hydra_run
        self._saved_variables = saved_variables or {}
        self.num_processes = num_processes
        self.grace = grace
        self._address, self._port = main_address, port
        self.failures: list[PeerFailedError] = []
        self._errors = errors
        self._delivered = False  # a failure was raised to rank 0's caller
        self._lock = threading.Lock()
        self._running = False
        self._leader_failed = False
        self._idle = threading.Event()  # set while rank 0 runs no work
        self._idle.set()
        self._verdict = threading.Event()  # set once a failure of another rank is judged
        self._forwarder = SignalForwarder(
            lambda: self.children, exit_after=True, stop_timeout=stop_timeout, grace=grace
        )
        self._forwarder.install()
        self._watcher = threading.Thread(
            target=self._watch, args=(main_address, port), name="plait-rank-watcher", daemon=True
        )
        self._watcher.start()

    @property
    def alive(self) -> bool:
        """Whether the ranks are still running the program (none has failed)."""
        return self._watcher.is_alive() and not self.failures

    def _leader_running(self, grace: float) -> list[int]:
        # After another rank's failure: whether rank 0 is still in its work at the
        # end of the grace period (stalled, if the failure was a timeout).
        return [] if self._idle.wait(max(grace, 0.0)) else [0]

    def _watch(self, main_address: str, port: int) -> None:
        try:
            watch(
                self.children,
                grace=self.grace,
                on_failure=lambda failure: announce_failure(
                    main_address, port, self.num_processes, failure
                ),
                others_running=self._leader_running,
            )
        except PeerFailedError as failure:
            with self._lock:
                if self._leader_failed:
                    return  # the others reacted to rank 0's own error, which is raised
                self.failures.append(failure)
                running = self._running
            self._verdict.set()
            if running:
                self._interrupt(failure)

    def _interrupt(self, failure: PeerFailedError) -> None:
        # Stop rank 0's work now: a real SIGINT to the main thread also ends a
        # sleep or a wait, where a simulated one would wait for it to finish.
        main = threading.main_thread()
        if main.ident is not None and main.is_alive():
            signal.pthread_kill(main.ident, signal.SIGINT)
        if self._idle.wait(self.grace):
            return
        # Stuck where no signal reaches it (inside a C call): report, and end the job.
        # Where rank 0 was comes first and the failure last, as a traceback ends with
        # its error: the last line the user reads is the cause, not the stuck stack.
        frames = sys._current_frames().get(main.ident or -1)
        where = "".join(traceback.format_stack(frames)) if frames is not None else ""
        sys.stderr.write(
            f"plait: rank 0 did not stop within {self.grace:g} s of being interrupted; "
            f"it was at:\n{where}plait: {failure}\n"
        )
        sys.stderr.flush()
        os._exit(1)

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
                self._idle.clear()
            try:
                result = function(*args, **kwargs)
            finally:
                with self._lock:
                    self._running = False
                    self._idle.set()
        except TrainingStopped:
            raise  # every rank stops at the same batch, and ends the program alike
        except BaseException as error:
            raise self._failed(error) from error
        if self.failures:
            self._delivered = True
            raise self.failures[0]
        return result

    def _failed(self, error: BaseException) -> BaseException:
        # What to raise when rank 0's work raised ``error``.
        if not self.failures and lost_peer(str(error)):
            # A reaction to another rank's failure that the watcher is still
            # judging (a lost connection): wait for its verdict.
            self._verdict.wait(max(self.grace, _VERDICT))
        with self._lock:
            if self.failures:
                self._delivered = True
                return self.failures[0]
            self._leader_failed = True
        # Rank 0's own error. The others are told (those waiting in a checked
        # collective raise it); those in a backend's collective wait on rank 0's
        # open connections, so they are killed soon. After a timeout, they get the
        # whole grace period: a rank that does not exit by itself then is stuck
        # elsewhere (it stalled, and rank 0 timed out waiting for it).
        waited = timeout_of(str(error))
        tail = "".join(traceback.format_exception_only(type(error), error))
        announce_failure(
            self._address,
            self._port,
            self.num_processes,
            PeerFailedError(0, None, tail),
            timeout=_SETTLE,  # the store may not exist yet, if rank 0 failed early
        )
        stalled = kill(self.children, self.grace if waited is not None else _SETTLE)
        self._watcher.join()
        if stalled and waited is not None:
            return PeerFailedError(min(stalled), -signal.SIGKILL, waited_by=[0], stalled_for=waited)
        return error

    def finish(self) -> None:
        """At exit: wait for the ranks to end the program; report a failure not yet raised."""
        self._watcher.join()
        self._forwarder.uninstall()
        release_reserved(self._port)  # held still if rank 0 started no process group
        self._errors.cleanup()
        if self.failures and not self._delivered:
            sys.stderr.write(f"plait: {self.failures[0]}\n")
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(1)  # the job failed, whatever this process's own status

    def restore_variables(self) -> None:
        """Give this process back the variables it had before it became rank 0 of the job."""
        for name, value in self._saved_variables.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_job: _Job | None = None
_alone_port: int | None = None


_finish_registered = False


def _finish_job() -> None:
    if _job is not None:
        _job.finish()


def end_a_finished_hydra_job() -> None:
    """In rank 0 of a Hydra multirun: end the job the ranks ran for the previous Hydra job.

    A rank this launcher starts in a Hydra app runs that one Hydra job (`HydraRun`),
    and its program ends with it. When the multirun goes on to its next job in this
    process, that job's strategies must not take the ended job's place in the
    environment (``RANK``, ``WORLD_SIZE``, its port) for theirs: this process departs
    from the job's process group, waits for the ranks to end as at exit, takes back
    the variables it had, and the next launch starts ranks for the new job. Nothing
    happens elsewhere: outside Hydra, within the same Hydra job, in a started rank.
    Strategies and the Trainer call it before they read the environment.
    """
    global _job
    if _job is None or _job.hydra_run is None:
        return
    current = current_hydra_run()
    if current is not None and current.output_dir == _job.hydra_run.output_dir:
        return
    end_job()
    job, _job = _job, None
    job.finish()
    job.restore_variables()


_became_rank = False


def leads_a_job() -> bool:
    """Whether this process is rank 0 of ranks this launcher started (in this program).

    Its environment then names a job's place (``RANK``, ``WORLD_SIZE``, ...) as a
    scheduler's would: a strategy made after the first launch must still launch
    through this launcher, which runs the work with the same ranks and watches them.
    """
    return _job is not None


def become_rank() -> None:
    """In a rank this launcher started: die with the launcher, and leave it any uncaught error.

    Called when the rank's strategy joins its job (and by `launch` in the rank);
    nothing happens in other processes, or a second time.
    """
    global _became_rank  # noqa: PLW0603 (once per process)
    if _became_rank or os.environ.get(LAUNCHED_VARIABLE) != "1":
        return
    _became_rank = True
    parent = os.environ.get(PARENT_VARIABLE)
    die_with_parent(int(parent) if parent else None)
    report_fatal_signals()
    _report_errors()


class SubprocessScriptLauncher:
    """Runs the user's program again for ranks 1 to n-1; this process is rank 0.

    This is the ``popen`` way of launching: no pickling, the program simply runs
    once per rank, and each copy finds its place from the variables it was given
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...). The ranks started by the first
    launch live as long as the program: a later launch (the ``test`` after a
    ``fit``) runs with the same ranks, which reach it in their own copy of the
    program. When a rank fails, the others are told through the job's store, get a
    grace period to exit, and are killed; rank 0 is interrupted (even in a sleep)
    and raises `PeerFailedError` naming the root cause: the rank that failed first
    for a reason of its own, or the rank that stalled while the others timed out
    waiting for it. If rank 0 fails, its own error is raised and the other ranks
    are stopped. At exit, rank 0 waits for the others to end the program. The
    ranks write to this process's terminal directly, and die with it however it
    ends; SIGTERM and SIGUSR1 sent to it are passed on to them, so that training
    stops gracefully on every rank together.

    Args:
        num_processes: How many ranks the job has, this process included.
        main_address: The rendezvous host; loopback by default.
        main_port: The rendezvous port; a free one by default.
        grace_period: Seconds between SIGTERM and SIGKILL when ranks are stopped.
        stop_timeout: Seconds a graceful stop may take: the ranks still running this
            long (and ``grace_period``) after a stop signal was passed on are killed.
            The `Trainer` sets it to its own ``stop_timeout``; ``None``: no bound.

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
        stop_timeout: float | None = STOP_TIMEOUT,
    ) -> None:
        self.num_processes = check_num_processes(num_processes)
        self.main_address = main_address
        self.main_port = main_port
        self.grace_period = grace_period
        self.stop_timeout = stop_timeout

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
        global _job, _finish_registered  # noqa: PLW0603 (one job per program: its ranks run it)
        if os.environ.get(LAUNCHED_VARIABLE) == "1":
            become_rank()
            return function(*args, **kwargs)
        kept: dict[int, object] = {}
        payload = pickled_work(function, args, kwargs, keep_modules=kept)
        if self.num_processes == 1 and _job is None:
            return cast("R", self._run_alone(payload, kept))
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
            if not _finish_registered:
                atexit.register(_finish_job)
                _finish_registered = True
            _job = job
        # As in every other rank, the work is made anew once this process knows its
        # place: a strategy in it finds rank 0 of the whole job. Its modules are the
        # caller's own, as in the other ranks' programs: a run trains (and shards)
        # them in place, and the next run of the job goes on with them.
        work, work_args, work_kwargs = unpickled_work(payload, kept)
        return cast("R", job.run(work, work_args, work_kwargs))

    def _run_alone(self, payload: bytes, kept: dict[int, object]) -> object:
        # A job of one process starts nothing: its variables hold while it runs,
        # and the program's own come back after (a process the program starts later
        # must not think itself rank 0 of a job). Its port is the program's: the
        # job's group, which outlives the run, is found again by the next one.
        global _alone_port  # noqa: PLW0603 (one job per program)
        port = self.main_port or _alone_port
        if port is None:
            port = _alone_port = reserve_port(self.main_address)
        mine = launch_variables(
            rank=0, world_size=1, main_address=self.main_address, main_port=port
        )
        try:
            with setting_variables(mine):
                work, work_args, work_kwargs = unpickled_work(payload, kept)
                return work(*work_args, **work_kwargs)
        finally:
            release_reserved(port)  # held still if the work started no process group

    def _start(self) -> _Job:
        # Held from now until rank 0 (this process) serves the job's store on it.
        port = self.main_port or reserve_port(self.main_address)
        warn_if_oversubscribed(self.num_processes)
        errors = tempfile.TemporaryDirectory(prefix="plait-ranks-")

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
                error_file = Path(errors.name, f"rank-{rank}.txt")
                environment = {
                    **os.environ,
                    **variables(rank),
                    LAUNCHED_VARIABLE: "1",
                    ERROR_FILE_VARIABLE: str(error_file),
                    PARENT_VARIABLE: str(os.getpid()),
                }
                command, cwd = _program(rank)
                popen = subprocess.Popen(command, env=environment, cwd=cwd)
                process = _Process(popen, error_file)
                children.append(Child(rank=rank, handle=process, traceback=process.traceback))
        except BaseException:
            stop(children, self.grace_period)
            errors.cleanup()
            raise
        saved = {name: os.environ.get(name) for name in variables(0)}
        os.environ.update(variables(0))
        return _Job(
            children,
            num_processes=self.num_processes,
            main_address=self.main_address,
            port=port,
            grace=self.grace_period,
            errors=errors,
            # Read when a signal comes: the Trainer sets it before each launch.
            stop_timeout=lambda: self.stop_timeout,
            hydra_run=current_hydra_run(),
            saved_variables=saved,
        )

    @override
    def __repr__(self) -> str:
        return f"SubprocessScriptLauncher(num_processes={self.num_processes})"
