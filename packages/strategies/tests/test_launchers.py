"""Launching real ranks: results come back, failures stop every rank and are named."""

import multiprocessing
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plait.core import ConfigurationError
from plait.strategies.launchers import MultiprocessingLauncher, SubprocessScriptLauncher
from plait.strategies.launchers.multiprocessing import pickled_work, unpickled_work

PROGRAM = Path(__file__).resolve().parent / "launch_main.py"


def launch(scenario: str, start_method: str, num_processes: int) -> str:
    return launched(scenario, start_method, num_processes).stdout


def launched(
    scenario: str, start_method: str, num_processes: int
) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(
            [sys.executable, str(PROGRAM), scenario, start_method, str(num_processes)],
            capture_output=True,
            text=True,
            timeout=100,  # within the test's own timeout: a hang shows what it printed
            check=False,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the launch did not end within 100 s:\n{hung.stdout!s}\n{hung.stderr!s}")
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["spawn", "fork", "forkserver"])
def test_every_rank_runs_and_rank_zeros_result_comes_back(start_method: str) -> None:
    output = launch("sum", start_method, 3)

    assert "result=33" in output  # (10 + 11 + 12), reduced across the three ranks
    assert "children left=0" in output


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_fork_starts_every_rank_before_the_launcher_runs_a_thread() -> None:
    # A rank forked while a thread of the launcher held a lock of the C library (the
    # job store's thread takes the resolver's for each peer that connects) waited on
    # it for ever when it resolved the store's address itself: 1 launch in 40 hung so.
    output = launch("threads", "fork", 3)

    assert "result=33" in output
    line = next(line for line in output.splitlines() if line.startswith("threads before="))
    before, forks = line.removeprefix("threads before=").split(" at forks=")
    counts = [int(count) for count in forks.strip("[]").split(",")]
    assert len(counts) == 3
    assert max(counts) <= int(before), line  # no thread of the launcher's ran at a fork


@pytest.mark.slow
def test_a_result_larger_than_a_pipe_comes_back() -> None:
    output = launch("big", "fork", 2)

    assert "result numel=1048576 rank=0" in output


@pytest.mark.slow
def test_work_larger_than_a_pipe_reaches_every_rank() -> None:
    # Sent after the ranks start, so that a large payload does not start them one by one.
    output = launch("bigwork", "spawn", 2)

    assert f"result={2 * (1 << 20)}" in output
    assert "children left=0" in output


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_a_failing_rank_stops_every_rank_and_is_named_with_its_traceback(
    start_method: str,
) -> None:
    output = launch("fail", start_method, 3)

    assert "failed rank=1 exit=1" in output
    assert "tail=ValueError: boom on rank 1" in output
    assert "children left=0" in output


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_named_with_the_signal() -> None:
    output = launch("kill", "fork", 2)

    assert "failed rank=1 exit=-9" in output
    assert "children left=0" in output


@pytest.mark.slow
def test_ranks_deaf_to_a_stop_signal_are_killed_after_the_stop_timeout_and_grace() -> None:
    # A job waited 50 minutes on ranks deadlocked in native code after SIGTERM.
    done = launched("deaf", "fork", 2)

    assert re.search(r"failed rank=[01] exit=-9", done.stdout), done.stdout
    assert "children left=0" in done.stdout
    assert "did not end within 2 s of SIGTERM" in done.stderr, done.stderr
    assert "killed with SIGKILL" in done.stderr


@pytest.mark.parametrize(
    ("num_processes", "start_method", "message"),
    [
        (0, "spawn", "num_processes=0 must be an int of at least 1"),
        (True, "spawn", "num_processes=True must be an int"),
        (2, "threads", "invalid start_method: 'threads'"),
        (2, "spwan", "did you mean 'spawn'"),
    ],
)
def test_bad_launcher_settings_are_refused(
    num_processes: int, start_method: str, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        MultiprocessingLauncher(num_processes, start_method=start_method)


def test_a_main_port_another_program_serves_is_refused_before_any_rank_starts() -> None:
    before = set(multiprocessing.active_children())  # other tests' processes, if any
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        launcher = MultiprocessingLauncher(2, start_method="fork", main_port=port)
        with pytest.raises(
            ConfigurationError, match=re.escape(f"cannot listen on 127.0.0.1:{port}")
        ) as error:
            launcher.launch(print, "never runs")
    assert "leave main_port unset" in str(error.value)
    assert set(multiprocessing.active_children()) <= before  # no rank was started


def test_a_main_address_that_names_no_host_is_refused() -> None:
    launcher = MultiprocessingLauncher(2, main_address="no-such-host.invalid")
    with pytest.raises(ConfigurationError, match=re.escape("main_address='no-such-host.invalid'")):
        launcher.launch(print, "never runs")


def test_only_fork_works_where_main_cannot_be_imported_again() -> None:
    assert MultiprocessingLauncher(2, start_method="fork").is_interactive_compatible
    assert not MultiprocessingLauncher(2, start_method="spawn").is_interactive_compatible


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "ddp_spawn", "ddp_fork", "ddp_notebook"])
def test_a_registered_ddp_strategy_launches_its_ranks_each_knowing_its_place(name: str) -> None:
    output = launch("strategy", name, 3)

    assert "result=(0, 3, 3)" in output  # rank 0 of 3; the ranks sum to 0 + 1 + 2
    assert "children left=0" in output


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "ddp_spawn"])
def test_a_registered_ddp_strategy_stops_every_rank_when_one_fails(name: str) -> None:
    output = launch("strategy_fail", name, 3)

    assert "failed rank=1 exit=1" in output
    tail = next(line for line in output.splitlines() if line.startswith("tail="))
    # popen: torch may prefix "[rank1]: ", and the ranks share the launcher's stdout, so
    # another process's output may follow on the same line.
    assert "ValueError: boom on rank 1" in tail
    # The surviving ranks raised PeerFailedError themselves, before being stopped.
    assert "rank 0 saw rank 1 fail" in output
    assert "rank 2 saw rank 1 fail" in output


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "ddp_spawn"])
def test_a_rank_that_aborts_in_native_code_leaves_its_python_stack(name: str) -> None:
    # A C++ std::terminate leaves no Python exception: the stack says where it was.
    run = launched("strategy_abort", name, 2)

    assert "failed rank=1 exit=-6" in run.stdout
    assert "Fatal Python error: Aborted" in run.stderr
    assert "abort_in_native_code" in run.stderr
    assert "children left=0" in run.stdout


def _place() -> tuple[str, str]:
    return os.environ["RANK"], os.environ["WORLD_SIZE"]


def test_a_job_of_one_process_leaves_the_programs_variables_as_they_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A process the program starts later must not think itself rank 0 of a job.
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")

    assert SubprocessScriptLauncher(1).launch(_place) == ("0", "1")

    assert "RANK" not in os.environ
    assert "MASTER_PORT" not in os.environ
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"


def _gathered(*args: object, **kwargs: object) -> tuple[object, ...]:
    return args, kwargs


def test_work_made_anew_in_this_process_keeps_the_callers_modules_and_tensors() -> None:
    # Rank 0 of a popen job runs the work made anew from a pickle (its strategies find
    # their place); its module and its data are the caller's own, never copies.
    module = torch.nn.Linear(2, 2)
    batches = [(torch.ones(2), torch.zeros(1)) for _ in range(3)]
    settings = {"epochs": [1, 2]}
    kept: dict[int, object] = {}
    payload = pickled_work(_gathered, (module, batches), {"settings": settings}, keep_modules=kept)
    assert len(payload) < 1024  # no tensor's values in it

    work, (module_again, batches_again), kwargs = unpickled_work(payload, kept)
    assert work is _gathered
    assert module_again is module
    assert isinstance(batches_again, list)
    assert batches_again is not batches  # the containers are made anew...
    assert batches_again[0][0] is batches[0][0]  # ...around the same tensors
    assert kwargs["settings"] == settings
    assert kwargs["settings"] is not settings
