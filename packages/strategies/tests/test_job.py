"""The job's process group lives from its first run to the program's end, and its end is clean."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROGRAM = Path(__file__).resolve().parent / "job_main.py"


def _leaving(status: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _LEAVING, str(status)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _job(scenario: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    completed = subprocess.run(
        [sys.executable, str(PROGRAM), scenario, "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = completed.stdout.splitlines()
    assert lines, completed.stderr
    assert lines[-1] == "end", completed.stdout + completed.stderr
    return completed, [json.loads(line) for line in lines[:-1]]


@pytest.mark.slow
def test_runs_of_one_job_share_its_group_until_the_settings_change_or_the_job_ends() -> None:
    completed, runs = _job("settings")

    assert completed.returncode == 0, completed.stderr
    first, again, other, ended, after = runs
    assert all(run.get("total") == 3 for run in (first, again, other, after))
    # The group outlives each run's teardown, and a second strategy with the same
    # settings runs on it.
    assert first["joined_after_teardown"] is True
    assert again["group"] == first["group"]
    assert again["generation"] == first["generation"]
    # Other settings (a timeout) end the job and join a group of their own.
    assert other["generation"] != first["generation"]
    # end_job() leaves no group; the next run joins a new job.
    assert ended == {"ended": True}
    assert after["generation"] not in (first["generation"], other["generation"])


@pytest.mark.slow
@pytest.mark.parametrize("failing", [0, 1])
def test_a_rank_failing_in_a_later_run_of_the_job_stops_it_as_in_the_first(failing: int) -> None:
    # Two runs end well on the job's group; in the third, a new strategy's, one rank
    # fails: rank 0's own error is raised as it is, another rank's is named with
    # its traceback, and no rank waits out the collective timeout (15 s) for it.
    completed, runs = _job(f"fail{failing}")

    assert completed.returncode == 0, completed.stderr
    assert [run.get("total") for run in runs[:2]] == [3, 3]
    if failing == 0:
        assert runs[2] == {"raised": "boom on rank 0"}
    else:
        assert runs[2]["failed"] == 1
        assert "ValueError: boom on rank 1" in str(runs[2]["message"])
    assert "timed out" not in completed.stderr


_LEAVING = textwrap.dedent(
    """
    import atexit, os, sys
    from plait.strategies.job import leave

    class TornDown:
        def __del__(self):
            os.write(1, b"torn down\\n")

    kept = TornDown()
    atexit.register(lambda: os.write(1, b"exit handler\\n"))
    sys.stdout.write("unflushed ")  # no newline: still in the buffer
    leave(int(sys.argv[1]))
    """
)


def test_leaving_after_success_runs_the_exit_handlers_flushes_and_skips_teardown() -> None:
    completed = _leaving(0)

    assert completed.returncode == 0, completed.stderr
    assert "exit handler" in completed.stdout
    assert "unflushed" in completed.stdout
    assert "torn down" not in completed.stdout  # the interpreter was not torn down


def test_leaving_after_a_failure_exits_with_its_status_as_usual() -> None:
    completed = _leaving(3)

    assert completed.returncode == 3
    assert "exit handler" in completed.stdout
    assert "torn down" in completed.stdout  # torn down as usual
