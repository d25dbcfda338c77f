"""The pytest plugin as a third party uses it: options, expectations, reports, errors.

Each test runs pytest in a fresh process, in a directory of its own, as an adopter's
project would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BROKEN = Path(__file__).resolve().with_name("conformance_broken.py")


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _suite(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the suite as it ships, as ``pytest --pyargs plait.conformance.suite ARGS``."""
    return _pytest(cwd, "--pyargs", "plait.conformance.suite", *args)


@pytest.mark.slow
def test_a_third_party_keeps_known_failures_in_an_expectations_file(tmp_path: Path) -> None:
    (tmp_path / "test_my_strategy.py").write_text(
        textwrap.dedent(
            f"""
            from plait.conformance import ConformanceSuite

            class TestMyStrategy(ConformanceSuite):
                strategies = ({f"{BROKEN}:ReversedAllGather"!r},)
                world_sizes = (2,)
            """
        ),
        encoding="utf-8",
    )
    (tmp_path / "expectations.txt").write_text(
        "# known failures\n"
        "all_gather[*-gloo-*]  # our rows come last rank first; fixed in 2.0\n"
        "sub_groups[*-gloo-*]  # a group's rows too\n"
        "no_such_property[*]  # a stale entry\n",
        encoding="utf-8",
    )

    run = _pytest(
        tmp_path,
        "--plait-examples=100",
        "--plait-expectations=expectations.txt",
        "--plait-report-dir=reports",
    )

    assert run.returncode == 0, run.stdout + run.stderr
    assert "8 passed, 2 xfailed" in run.stdout
    assert "expectation 'no_such_property[*]' (line 4) matched no test" in run.stdout
    report = json.loads(
        (tmp_path / "reports" / "conformance_broken_ReversedAllGather-gloo-2.json").read_text()
    )
    assert report["world_size"] == 2
    assert report["backend"] == "gloo"
    assert report["passed"] is True
    assert report["properties"]["all_gather"]["outcome"] == "xfailed"
    assert report["properties"]["broadcast"] == {
        "outcome": "passed",
        "examples": 100,
        "seconds": report["properties"]["broadcast"]["seconds"],
        "message": "",
    }


@pytest.mark.slow
def test_the_shipped_suite_runs_a_registered_strategy_on_xdist_workers(tmp_path: Path) -> None:
    run = _suite(
        tmp_path,
        "--plait-strategy=ddp",
        "--plait-world-sizes=1,2",
        "--plait-examples=5",
        "--plait-report-dir=reports",
        "-n",
        "2",
        "--dist",
        "loadgroup",
    )

    assert run.returncode == 0, run.stdout + run.stderr
    assert "17 passed, 3 skipped" in run.stdout
    assert "ddp-gloo-2: 10 passed" in run.stdout
    reports = sorted(path.name for path in (tmp_path / "reports").iterdir())
    assert reports == ["ddp-gloo-1.json", "ddp-gloo-2.json"]
    one = json.loads((tmp_path / "reports" / "ddp-gloo-1.json").read_text())
    assert one["properties"]["mismatch"]["outcome"] == "skipped"
    assert "needs 2 ranks or more" in one["properties"]["mismatch"]["message"]


@pytest.mark.slow
def test_a_hang_is_reported_once_with_every_ranks_stack(tmp_path: Path) -> None:
    run = _suite(
        tmp_path,
        f"--plait-strategy={BROKEN}:unchecked_ddp",
        "--plait-world-sizes=2",
        "--plait-examples=50",
        "--plait-deadline=3",
        "-k",
        "test_mismatch",
    )

    assert run.returncode == 1, run.stdout + run.stderr
    assert "ContractViolation: mismatch failed" in run.stdout
    assert "did not finish within 3 s (a hang)" in run.stdout
    assert "rank 0 (pid" in run.stdout
    assert "rank 1 (pid" in run.stdout
    assert "is stuck here:" in run.stdout


@pytest.mark.slow
def test_a_failure_names_the_property_and_prints_how_to_rerun_it(tmp_path: Path) -> None:
    run = _suite(
        tmp_path,
        f"--plait-strategy={BROKEN}:ImpatientBarrier",
        "--plait-world-sizes=2",
        "--plait-examples=50",
        "-k",
        "test_barrier and not timeout",
    )

    assert run.returncode == 1, run.stdout + run.stderr
    assert (
        "ContractViolation: barrier failed for 'conformance_broken:ImpatientBarrier'" in run.stdout
    )
    assert "left the barrier when only 1 of 2 ranks had entered" in run.stdout
    assert "reproduce(" in run.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "TestContract names no strategy: pass --plait-strategy=NAME"),
        (("--plait-strategy=ddpp",), "did you mean 'ddp'"),
        (
            ("--plait-strategy=ddp", "--plait-world-sizes=0,2"),
            "--plait-world-sizes='0,2' must list",
        ),
        (("--plait-strategy=ddp", "--plait-examples=0"), "--plait-examples=0 must be 1 or more"),
        (("--plait-strategy=ddp", "--plait-backend=ncl"), "invalid choice: 'ncl'"),
        (("--plait-strategy=ddp", "--plait-expectations=nowhere.txt"), "no such file"),
    ],
)
def test_bad_options_stop_the_run_with_a_clear_message(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    run = _suite(tmp_path, *args)

    assert run.returncode in (2, 4), run.stdout + run.stderr  # collection or usage error
    assert message in run.stdout + run.stderr


def test_an_expectation_without_a_reason_is_refused(tmp_path: Path) -> None:
    (tmp_path / "expectations.txt").write_text("broadcast[*]\n", encoding="utf-8")

    run = _suite(
        tmp_path,
        "--plait-strategy=ddp",
        "--plait-expectations=expectations.txt",
    )

    assert run.returncode == 4, run.stdout + run.stderr
    assert "expectations.txt:1: 'broadcast[*]' gives no reason" in run.stderr


def test_a_lane_without_its_hardware_is_skipped_with_the_reason(tmp_path: Path) -> None:
    run = _suite(
        tmp_path,
        "--plait-strategy=ddp",
        "--plait-backend=xla",
        "--plait-world-sizes=2",
        "-rs",
    )

    assert run.returncode == 0, run.stdout + run.stderr
    assert "10 skipped" in run.stdout
    assert "the xla lane needs torch_xla, which is not installed" in run.stdout
