"""Scripts run warm (`tests.warm`) behave as ``python SCRIPT ARGS`` would, and a job that
leaves a process behind fails its test."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from tests import warm
from tests.reliability.jobs import wait_for

SCRIPT = """
import atexit, os, sys, time

import torch

atexit.register(lambda: print("atexit ran"))
print("argv", sys.argv[1:], "X", os.environ.get("X"), "cwd", os.getcwd())
print("threads", torch.get_num_threads(), "main", __name__)
print("imported", [name for name in sys.argv[2:] if name in sys.modules])
print("to stderr", file=sys.stderr)
action = sys.argv[1]
if action == "raise":
    raise RuntimeError("the script failed")
if action == "hook-then-raise":
    sys.excepthook = lambda kind, error, tb: print("hooked", kind.__name__, file=sys.stderr)
    raise RuntimeError("the script failed")
if action == "interrupt":
    raise KeyboardInterrupt
if action == "sleep":
    time.sleep(600)
if action == "spin-then-leave":  # as the plait command ends: exit functions, then _exit
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    atexit._run_exitfuncs()
    os._exit(0)
if action == "leave-a-child":
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
sys.exit(int(action) if action.isdigit() else 0)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return path


def test_a_script_runs_as_main_with_its_arguments_environment_folder_and_exit_status(
    script: Path, tmp_path: Path
) -> None:
    environ = {**os.environ, "X": "y", "OMP_NUM_THREADS": "1"}
    # What the fork server imported (tests.preload, named in pyproject.toml), the
    # script has before its first line.
    preloaded = ["torch._dynamo", "plait.strategies.fsdp", "plait.trainer"]
    if warm.preloads_deepspeed():
        preloaded += ["deepspeed", warm.ZERO_OPTIMIZERS]
    process = warm.WarmProcess(script, ["3", *preloaded], environ, cwd=tmp_path)
    try:
        assert process.wait(60) == 3
        output = process.output()
    finally:
        process.close()

    assert f"argv {['3', *preloaded]} X y cwd {tmp_path}\n" in output
    assert "threads 1 main __main__\n" in output
    assert f"imported {preloaded}\n" in output
    # Unbuffered, in the order written, and the atexit functions run at the end.
    assert output.index("threads") < output.index("to stderr") < output.index("atexit ran")


def test_an_exception_exits_1_with_its_traceback_and_a_signal_with_minus_its_number(
    script: Path,
) -> None:
    failed = warm.run(script, ["raise"], timeout=60)
    assert failed.returncode == 1
    assert failed.stderr.rstrip().endswith("RuntimeError: the script failed")
    assert "atexit ran" in failed.stdout

    # As an interpreter: sys.excepthook reports it, and an interrupt ends by SIGINT.
    hooked = warm.run(script, ["hook-then-raise"], timeout=60)
    assert hooked.returncode == 1
    assert hooked.stderr.rstrip().endswith("hooked RuntimeError")
    interrupted = warm.run(script, ["interrupt"], timeout=60)
    assert interrupted.returncode == -signal.SIGINT
    assert interrupted.stderr.rstrip().endswith("KeyboardInterrupt")
    assert "atexit ran" in interrupted.stdout

    sleeping = warm.WarmProcess(script, ["sleep"], dict(os.environ))
    try:
        assert sleeping.wait(0.5) is None
        os.kill(sleeping.pid, signal.SIGTERM)
        assert sleeping.wait(60) == -signal.SIGTERM
    finally:
        sleeping.close()


def test_a_job_that_leaves_a_process_in_its_session_fails_and_the_process_is_killed(
    script: Path,
) -> None:
    with pytest.raises(AssertionError, match="left processes behind") as raised:
        warm.run(script, ["leave-a-child"], timeout=60)

    listed = str(raised.value).split("left processes behind: [", 1)[1].split("]", 1)[0]
    [left] = [int(pid) for pid in listed.split(",")]
    wait_for(lambda: _gone(left), 10, f"process {left}, killed, to end")


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not yet reaped has ended)."""
    try:
        state = Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in {"Z", "X"}


def test_a_module_runs_as_with_dash_m_from_the_folder_it_is_given_with_pythonpath_first(
    tmp_path: Path,
) -> None:
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "local_tool.py").write_text(
        "import sys, other\nprint(sys.argv, sys.path[:2], other.NAME)\nsys.exit(4)\n"
    )
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "other.py").write_text("NAME = 'other'\n")

    done = warm.run(
        warm.Module("local_tool"), ["a", "b"], cwd=tmp_path / "here",
        environ={"PYTHONPATH": str(tmp_path / "lib")}, timeout=60,
    )  # fmt: skip

    assert done.returncode == 4, done.stderr
    assert done.args[1:3] == ["-m", "local_tool"]
    # As python -m: argv[0] the module's file, its folder (the working one) first on
    # the path, then PYTHONPATH's entries.
    module = str(tmp_path / "here" / "local_tool.py")
    path = [str(tmp_path / "here"), str(tmp_path / "lib")]
    assert done.stdout == f"{[module, 'a', 'b']} {path} other\n"


def test_the_cpu_time_of_a_script_counts_when_it_leaves_by_os_exit(script: Path) -> None:
    before = warm.cpu_seconds()

    done = warm.run(script, ["spin-then-leave"], timeout=60)

    assert done.returncode == 0, done.stderr
    assert "atexit ran" in done.stdout
    assert warm.cpu_seconds() - before >= 0.3
