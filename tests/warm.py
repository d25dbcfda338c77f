"""Scripts run as processes forked from a server that has imported torch and plait.

A new interpreter spends over a second of CPU importing torch and plait before a
script's first line. A test whose subject is not how a process starts (a rank's
collectives, a job's training and checkpoints) runs its script here instead: each
process is a fork of :mod:`multiprocessing`'s fork server, which imports torch and
plait (`tests.preload`, named by the ``plait_preload`` ini option) once per test
process and has started no thread and no process group, and runs the script as
``python SCRIPT ARGS`` would: as ``__main__``, with ``sys.argv``, the environment (its
``PYTHONPATH`` on ``sys.path``) and the working directory it is given, its output in a
file, its exit status that of the script (``sys.exit``'s code; 1 for an uncaught
exception, which ``sys.excepthook`` reports; minus the signal's number if one ended it,
SIGINT's for an uncaught interrupt), its ``atexit`` functions run at its end.

What tests the start itself (torchrun, Slurm, ``popen``, ``spawn``, a launcher that is
killed) starts real interpreters, as a user's job does. A script run here that starts
processes of its own (a launcher) starts them as it always does.

The fork server is the one of the test process: a conformance lane's rank pool may
have started it first, with its own strategy's modules besides
(`plait.conformance.pool.fork_server_modules`). What a script imports beyond them, it
imports itself.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import io
import multiprocessing
import os
import resource
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from tests.processes import processes_in_session

from plait.conformance.pool import fork_server_modules

ZERO_OPTIMIZERS: Final = "deepspeed.runtime.zero.muon.muon_optimizer"
"""What DeepSpeed imports when it first checks an optimizer (``is_zero_supported_optimizer``)."""


def preloads_deepspeed() -> bool:
    """Whether the fork server imports DeepSpeed (`tests.preload`): where it is installed,
    on a build of torch for the CPU alone, whose ranks all tell DeepSpeed the CPU."""
    import torch  # noqa: PLC0415 (this module imports no torch of its own)

    from plait.strategies.deepspeed import library  # noqa: PLC0415

    return torch.version.cuda is None and torch.version.hip is None and library.is_available()


_cpu_seconds = 0.0


def cpu_seconds() -> float:
    """The CPU time of the scripts this process ran warm and closed (each with its own
    children), as each measured it at its end; one killed before it is not counted."""
    return _cpu_seconds


M_MMAP_THRESHOLD: Final = -3
"""glibc's ``mallopt`` parameter that ``MALLOC_MMAP_THRESHOLD_`` sets at a program's start."""


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


@dataclasses.dataclass(frozen=True)
class Module:
    """A module run as ``python -m NAME ARGS`` runs it, where a script's path goes."""

    name: str


def _run_script(
    *,
    script: str,
    module: bool,
    args: list[str],
    environ: dict[str, str],
    cwd: str,
    output: str,
    errors: str,
    new_session: bool,
) -> None:
    """The forked process: become ``python SCRIPT ARGS`` and run it to its end."""
    if new_session:
        os.setsid()
    for stream, path in ((1, output), (2, errors)):
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(descriptor, stream)
        os.close(descriptor)
    # Unbuffered, as ``python -u``: the two streams interleave in the order written.
    sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True)  # noqa: SIM115
    sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), write_through=True)  # noqa: SIM115
    sys.stdin = open(os.devnull)  # noqa: SIM115 - a script run as a job reads no input
    os.environ.clear()
    os.environ.update(environ)
    threshold = environ.get("MALLOC_MMAP_THRESHOLD_")
    if threshold is not None:
        # glibc reads it when a program starts: set now, as it would have been.
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, int(threshold))
    torch = sys.modules.get("torch")
    if torch is not None and "OMP_NUM_THREADS" in environ:
        # The server's torch read the variable when it was imported: as set now.
        torch.set_num_threads(int(environ["OMP_NUM_THREADS"]))
    os.chdir(cwd)
    sys.argv = [script, *args]
    # What an interpreter puts first on its path: the script's folder (the working
    # directory for ``-m``), then PYTHONPATH's.
    search = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[0:0] = [os.getcwd() if module else str(Path(script).resolve().parent), *search]
    # Its CPU time, and its children's, for the test's count (a fork server's child is
    # no child of the test's process, whose own count misses it): noted by an exit
    # function registered before the script's own, so run after them, and run too by a
    # script that runs the exit functions and then leaves by ``os._exit`` (the ``plait``
    # command).
    atexit.register(_note_cpu_seconds, Path(output + ".cpu"))
    code, interrupted = 0, False
    try:
        if module:  # as ``-m``: sys.argv[0] becomes the module's file
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as raised:
        code = _exit_code(raised.code)
    except BaseException as raised:  # noqa: BLE001 - reported as the interpreter would
        sys.excepthook(type(raised), raised, raised.__traceback__)
        # Exit status 1; an interrupt ends the process by SIGINT, once cleaned up.
        code = 1
        interrupted = isinstance(raised, KeyboardInterrupt)
    finally:
        # What an interpreter does at its end: wait for the threads that are not
        # daemons, then the atexit functions (plait's and torch's among them).
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def own_cpu_seconds() -> float:
    """The user and system seconds of this process and of its children waited for."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def _note_cpu_seconds(path: Path) -> None:
    """Write `own_cpu_seconds` to ``path``."""
    path.write_text(f"{own_cpu_seconds():.3f}")


class WarmProcess:
    """A script (or a `Module`) running in a process forked from the fork server."""

    def __init__(
        self,
        script: Path | Module,
        args: Sequence[str],
        environ: Mapping[str, str],
        *,
        cwd: Path | None = None,
        new_session: bool = False,
        separate_errors: bool = False,
    ) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(fork_server_modules())
        self._output = Path(tempfile.mkstemp(prefix="plait-warm-", suffix=".log")[1])
        self._errors = (
            Path(tempfile.mkstemp(prefix="plait-warm-", suffix=".err")[1])
            if separate_errors
            else self._output
        )
        self._process = context.Process(
            target=_run_script,
            kwargs={
                "script": script.name if isinstance(script, Module) else str(script),
                "module": isinstance(script, Module),
                "args": [str(arg) for arg in args],
                "environ": dict(environ),
                "cwd": str(cwd or Path.cwd()),
                "output": str(self._output),
                "errors": str(self._errors),
                "new_session": new_session,
            },
            name=f"warm {script.name}",
        )  # fmt: skip
        self._process.start()

    @property
    def pid(self) -> int:
        """The process's id."""
        pid = self._process.pid
        assert pid is not None
        return pid

    @property
    def returncode(self) -> int | None:
        """The exit status, or None while it runs."""
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait at most ``timeout`` seconds for the end; the exit status, or None."""
        self._process.join(timeout)
        return self._process.exitcode

    def kill(self) -> None:
        """End it now (SIGKILL), if it still runs."""
        if self._process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        self._process.join(30)

    def output(self) -> str:
        """What it wrote to its standard output (and error, unless kept apart), in order."""
        return self._output.read_text(errors="replace")

    def errors(self) -> str:
        """What it wrote to its standard error (with its output, unless kept apart)."""
        return self._errors.read_text(errors="replace")

    def close(self) -> None:
        """Kill it if it runs; count its CPU time (`cpu_seconds`); remove its files."""
        global _cpu_seconds  # noqa: PLW0603 - one count for the test process
        self.kill()
        self._process.close()
        spent = self._output.with_name(self._output.name + ".cpu")
        with contextlib.suppress(OSError, ValueError):
            _cpu_seconds += float(spent.read_text())
        for path in (self._output, self._errors, spent):
            path.unlink(missing_ok=True)


def run(
    script: Path | Module,
    args: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """Run ``python SCRIPT ARGS`` (``python -m NAME ARGS`` for a `Module`) warm, in a
    session of its own, to its end.

    The environment is this process's with ``environ`` on top. Returns its exit status,
    output and errors, as ``subprocess.run(..., capture_output=True, text=True)``.

    Raises:
        AssertionError: It outlived ``timeout`` seconds, or a process it started (a
            rank) was still in its session 10 s after it ended; either is killed first.
    """
    process = WarmProcess(
        script, args, {**os.environ, **(environ or {})}, cwd=cwd, new_session=True,
        separate_errors=True,
    )  # fmt: skip
    try:
        code = process.wait(timeout)
        # What it started may be ending still: 10 s for its session to empty.
        deadline = time.monotonic() + (10 if code is not None else 0)
        while (left := processes_in_session(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        output, errors = process.output(), process.errors()
    finally:
        process.close()
    start = ["-m", script.name] if isinstance(script, Module) else [str(script)]
    command = [sys.executable, *start, *map(str, args)]
    if code is None:
        raise AssertionError(f"{command} did not end within {timeout:g} s:\n{errors[-4000:]}")
    assert not left, f"{command} left processes behind: {left}\n{errors[-4000:]}"
    return subprocess.CompletedProcess(command, code, output, errors)
