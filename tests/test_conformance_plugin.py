"""The pytest plugin as a third party uses it: options, expectations, reports, errors.

Each test runs ``python -m pytest`` in a process of its own, in a directory of its own,
as an adopter's project would: forked warm (`tests.warm`), where torch and plait are
imported already, since what is tested is the session, not an interpreter's start; the
ranks and xdist workers it starts, it starts as it always does. The bad options, which
stop a run before any rank starts, run one after another in one such process
(`pytest.main` for each, as ``python -m pytest``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Final

import pytest
from tests import warm

BROKEN = Path(__file__).resolve().with_name("conformance_broken.py")
RUN_TIMEOUT = 300

# pytest's own bound (120 s) is for a test in one process. A test here is bounded by its
# runs' timeouts (one suite, or a few runs of seconds each), and pytest's bound is a
# minute more than one run's, so that a run that goes long is reported with its output.
pytestmark = pytest.mark.timeout(RUN_TIMEOUT + 60)


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    arguments = ["-p", "no:cacheprovider", "-q", *args]
    return warm.run(warm.Module("pytest"), arguments, cwd=cwd, timeout=RUN_TIMEOUT)


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
    # point_to_point runs along a mesh's dimensions, and this lane has no mesh.
    assert "8 passed, 1 skipped, 2 xfailed" in run.stdout
    assert "expectation 'no_such_property[*]' (line 4) matched no test" in run.stdout
    report = json.loads(
        (tmp_path / "reports" / "conformance_broken_ReversedAllGather-gloo-2.json").read_text()
    )
    assert report["world_size"] == 2
    assert report["backend"] == "gloo"
    assert report["passed"] is True
    assert report["properties"]["all_gather"]["outcome"] == "xfailed"
    broadcast = report["properties"]["broadcast"]
    assert broadcast["outcome"] == "passed"
    assert broadcast["examples"] > 100  # the grid's, then 100 drawn
    assert broadcast["message"] == ""
    assert 0 < broadcast["proving_seconds"] <= broadcast["seconds"]


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
    # The contract's eleven properties and the four training ones, on the same pools
    # (point_to_point skipped on both: neither lane has a mesh).
    assert "25 passed, 5 skipped" in run.stdout
    assert "ddp-gloo-2: 14 passed" in run.stdout
    reports = sorted(path.name for path in (tmp_path / "reports").iterdir())
    assert reports == ["ddp-gloo-1.json", "ddp-gloo-2.json"]
    # Each lane runs on one worker, so its ranks start once, counted across workers.
    for name in reports:
        assert json.loads((tmp_path / "reports" / name).read_text())["pool_starts"] == 1
    assert run.stdout.count("; ranks started once") == 2
    one = json.loads((tmp_path / "reports" / "ddp-gloo-1.json").read_text())
    assert one["properties"]["mismatch"]["outcome"] == "skipped"
    assert "needs 2 ranks or more" in one["properties"]["mismatch"]["message"]
    two = json.loads((tmp_path / "reports" / "ddp-gloo-2.json").read_text())
    for name in ("declared_semantics", "checkpoint_round_trip", "resume_exactness"):
        assert two["properties"][name]["outcome"] == "passed"
    # DDP declares that its checkpoints move to FSDP and DeepSpeed: both were proven.
    assert two["properties"]["checkpoint_moves"]["outcome"] == "passed"


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


@pytest.mark.slow
def test_one_bug_reads_as_one_headline_and_its_consequences_follow_it(tmp_path: Path) -> None:
    # A sum of int64 one too many: reduce_tensors shows it, and so does the plain
    # reduce every rank runs after raising in mismatch and bad_arguments.
    run = _suite(
        tmp_path,
        f"--plait-strategy={BROKEN}:Int64SumOffByOne",
        "--plait-world-sizes=2",
        "--plait-examples=5",
        f"--plait-report-dir={tmp_path / 'reports'}",
        "-vvv",  # with -q: verbose 2, where the short summary shows each reason whole (as on CI)
        "-k",
        "reduce_tensors or mismatch or bad_arguments",
    )

    assert run.returncode == 1, run.stdout + run.stderr
    out = run.stdout
    # The first line of each failure is its root cause, without the suite's frames.
    assert "All traceback entries are hidden" in out
    assert "Property(" not in out
    assert "Falsifying" not in out
    assert "Failing explicit example" not in out
    assert (
        "ContractViolation: reduce_tensors failed for 'conformance_broken:Int64SumOffByOne' "
        "(gloo, world size 2): every rank: element 0 is " in out
    )
    assert (
        "ContractViolation: mismatch failed for 'conformance_broken:Int64SumOffByOne' (gloo, "
        "world size 2), likely a consequence of reduce_tensors, which failed before it on "
        "this lane" in out
    )
    # The run's summary: the cause first, with its reason; then what follows from it.
    summary = out[out.index("plait conformance ===") :].splitlines()
    cause = next(i for i, line in enumerate(summary) if "FAILED reduce_tensors: every rank" in line)
    after = [i for i, line in enumerate(summary) if "after it " in line]
    assert len(after) == 2, summary
    assert all(i > cause for i in after)
    assert any("after it mismatch: a likely consequence of reduce_tensors: " in s for s in summary)
    assert any(
        "after it bad_arguments: a likely consequence of reduce_tensors" in s for s in summary
    )
    # pytest's short summary gives each failure's headline, on one line.
    node = "plait/conformance/suite.py::TestContract::test_mismatch[conformance_broken:"
    assert f"FAILED {node}Int64SumOffByOne-gloo-2] - ContractViolation: mismatch failed" in out
    short = out[out.index("short test summary info") :]
    assert "Run this example alone" not in short
    report = json.loads(
        (tmp_path / "reports" / "conformance_broken_Int64SumOffByOne-gloo-2.json").read_text()
    )
    mismatch = report["properties"]["mismatch"]["violation"]
    assert mismatch["consequence_of"] == ["reduce_tensors"]
    assert mismatch["headline"].startswith("mismatch failed for")
    assert report["properties"]["reduce_tensors"]["violation"]["consequence_of"] == []


BAD_OPTIONS: Final = [
    ((), "TestContract names no strategy: pass --plait-strategy=NAME"),
    (("--plait-strategy=ddpp",), "did you mean 'ddp'"),
    (
        ("--plait-strategy=ddp", "--plait-world-sizes=0,2"),
        "--plait-world-sizes='0,2' must list",
    ),
    (("--plait-strategy=ddp", "--plait-examples=0"), "--plait-examples: 0 must be 1 or more"),
    (("--plait-strategy=ddp", "--plait-world-sizes=1,,2"), "separated by commas"),
    (("--plait-strategy=ddp", "--plait-deadline=soon"), "'soon' is not a number of seconds"),
    (("--plait-strategy=ddp", "--plait-seed=-1"), "--plait-seed: -1 must be 0 or more"),
    (
        ("--plait-strategy=plait.strategies.DDPStrategy",),
        "write 'plait.strategies:DDPStrategy'",
    ),
    (
        ("--plait-strategy=plait.strategies:DDPStrategi",),
        "did you mean 'plait.strategies:DDPStrategy'?",
    ),
    (
        ("--plait-strategy=ddp", "--plait-backend=nccl", "--plait-require-lanes"),
        "the nccl lane needs a CUDA device: this machine has 0",
    ),
    (("--plait-strategy=ddp", "--plait-backend=ncl"), "invalid choice: 'ncl'"),
    (("--plait-strategy=ddp", "--plait-expectations=nowhere.txt"), "no such file"),
    (("--plait-strategy=ddp", "--plait-meshes=4:2x3"), "the mesh 2x3 holds 6 ranks, not 4"),
    (
        ("--plait-strategy=ddp", "-o", "plait_preload=plait.strategies.deepspeeed"),
        "preload: no module 'plait.strategies.deepspeeed' can be imported here",
    ),
    (
        ("--plait-strategy=ddp", "-o", "plait_preload=deepspeed-zero"),
        "preload: 'deepspeed-zero' is not a module name",
    ),
]
"""Options that stop the run before any rank starts, and what the run says of them."""

_EACH_RUN: Final = """
import contextlib, io, json, sys
import pytest

SUITE = "plait.conformance.suite"
results = []
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = pytest.main(["-p", "no:cacheprovider", "-q", "--pyargs", SUITE, *args])
    results.append({"code": int(code), "output": out.getvalue() + err.getvalue()})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def bad_option_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, ...], dict[str, object]]:
    """Each row of `BAD_OPTIONS` run by the shipped suite: its exit code and output."""
    cwd = tmp_path_factory.mktemp("bad-options")
    arguments = [list(args) for args, _ in BAD_OPTIONS]
    done = subprocess.run(
        [sys.executable, "-c", _EACH_RUN, json.dumps(arguments)],
        cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results: list[dict[str, object]] = json.loads(done.stdout.splitlines()[-1])
    return {args: result for (args, _), result in zip(BAD_OPTIONS, results, strict=True)}


# One group: the module's fixture runs them in one process, once, on one worker.
@pytest.mark.xdist_group("conformance_plugin_bad_options")
@pytest.mark.parametrize(("args", "message"), BAD_OPTIONS)
def test_bad_options_stop_the_run_with_a_clear_message(
    bad_option_runs: dict[tuple[str, ...], dict[str, object]], args: tuple[str, ...], message: str
) -> None:
    run = bad_option_runs[args]
    output = str(run["output"])

    assert run["code"] in (2, 4), output  # collection or usage error
    assert message in output
    if run["code"] == 4:  # a usage error: said once (a collection error adds a summary)
        assert output.count(message) == 1, output


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
    assert "15 skipped" in run.stdout
    assert "the xla lane needs torch_xla, which is not installed" in run.stdout


FACTORIES = """
import time

from plait.strategies import DDPStrategy


def raises():
    raise RuntimeError("no driver for this device")


def the_class():
    return DDPStrategy


def slow():
    time.sleep(30)
    return DDPStrategy()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("factory", "args", "error"),
    [
        ("raises", (), "RuntimeError: no driver for this device"),
        ("the_class", (), "returned the class DDPStrategy, not a strategy made from it"),
        ("slow", ("--plait-start-timeout=2",), "did not join within 2 s"),
    ],
)
def test_ranks_that_cannot_start_fail_the_lane_once_saying_why(
    tmp_path: Path, factory: str, args: tuple[str, ...], error: str
) -> None:
    (tmp_path / "factories.py").write_text(FACTORIES, encoding="utf-8")

    run = _suite(
        tmp_path,
        f"--plait-strategy=factories.py:{factory}",
        "--plait-world-sizes=2",
        "-k",
        "reduce_tensors or broadcast or barrier_timeout",
        "-rs",
        *args,
    )

    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "1 failed, 2 skipped" in output, output
    assert error in output
    if factory != "slow":
        assert output.count(error) <= 2, output  # one lane, one error (and its summary line)
        assert "ranks 0, 1:" in output  # every rank failed alike: said once
    assert "could not start: see the error of test_reduce_tensors[factories:" in output


@pytest.mark.slow
def test_a_failure_report_holds_the_violation_the_example_and_the_counts(tmp_path: Path) -> None:
    run = _suite(
        tmp_path,
        f"--plait-strategy={BROKEN}:ImpatientBarrier",
        "--plait-world-sizes=1,2",
        "--plait-examples=5",
        "--plait-seed=3",
        # The mismatch property of 2 ranks hangs on the barrier that returns at once:
        # the hang is reported after this, not after the default 30 s.
        "--plait-deadline=10",
        "--plait-report-dir=reports",
        "-k",
        "test_barrier or test_mismatch",
    )

    assert run.returncode == 1, run.stdout + run.stderr
    assert "seed 3: --plait-seed=3 draws the same examples" in run.stdout
    assert "This example is on the property's grid" in run.stdout
    reports = tmp_path / "reports"
    two = json.loads((reports / "conformance_broken_ImpatientBarrier-gloo-2.json").read_text())
    barrier = two["properties"]["barrier"]
    assert barrier["outcome"] == "failed"
    assert barrier["message"].startswith("rank "), barrier["message"]
    assert "left the barrier when only 1 of 2 ranks had entered" in barrier["message"]
    assert "Traceback" not in barrier["message"]
    assert isinstance(barrier["examples"], int)
    violation = barrier["violation"]
    assert violation["property"] == "barrier"
    assert violation["world_size"] == 2
    assert violation["kind"] == "BarrierCase"
    assert violation["explicit"] is True
    assert violation["seed"] == 3
    assert violation["snippet"].startswith("from plait.conformance import reproduce")
    one = json.loads((reports / "conformance_broken_ImpatientBarrier-gloo-1.json").read_text())
    assert one["properties"]["mismatch"]["message"] == "mismatch needs 2 ranks or more"


@pytest.mark.slow
def test_the_same_seed_draws_the_same_examples_and_the_header_names_it(tmp_path: Path) -> None:
    runs = [
        _pytest(
            tmp_path,
            "--pyargs",
            "plait.conformance.suite",
            f"--plait-strategy={BROKEN}:Float64ThroughFloat32",
            "--plait-world-sizes=2",
            "--plait-seed=12",
            "-k",
            "reduce_numbers",
            "-p",
            "no:xdist",
        )
        for _ in range(2)
    ]

    assert runs[0].returncode == 0, runs[0].stdout + runs[0].stderr
    counts = [line for run in runs for line in run.stdout.splitlines() if "-gloo-2:" in line]
    assert len(counts) == 2
    assert counts[0].split(";")[1].split(",")[0] == counts[1].split(";")[1].split(",")[0]
    assert "PytestUnknownMarkWarning" not in runs[0].stdout + runs[0].stderr


def test_the_shipped_suite_has_a_file_path_in_its_test_ids_and_a_seed_in_its_header(
    tmp_path: Path,
) -> None:
    ids = _suite(tmp_path, "--plait-strategy=ddp", "--collect-only", "-p", "no:xdist")
    header = _suite(tmp_path, "--plait-strategy=ddp", "--collect-only", "-p", "no:xdist", "-v")

    assert ids.returncode == 0, ids.stdout + ids.stderr
    assert "plait/conformance/suite.py::TestContract::test_broadcast[ddp-gloo-3]" in ids.stdout
    assert "plait conformance: seed " in header.stdout


def test_expectations_match_the_strategy_as_written_and_keep_other_lanes_quiet(
    tmp_path: Path,
) -> None:
    (tmp_path / "factories.py").write_text(FACTORIES, encoding="utf-8")
    (tmp_path / "expectations.txt").write_text(
        "all_gather[factories.py:raises-gloo-2]  # as written on the command line\n"
        "broadcast[*-nccl-*]  # a GPU job's entry\n"
        "broadcst[factories:raises-gloo-2]  # misspelt\n",
        encoding="utf-8",
    )

    run = _suite(
        tmp_path,
        "--plait-strategy=factories.py:raises",
        "--plait-world-sizes=2",
        "--plait-expectations=expectations.txt",
        "--collect-only",
    )

    assert run.returncode == 0, run.stdout + run.stderr
    assert "broadcast[*-nccl-*]" not in run.stdout  # for lanes another run has
    assert "all_gather[factories.py:raises-gloo-2]" not in run.stdout  # it matched
    assert (
        "expectation 'broadcst[factories:raises-gloo-2]' (line 3) matched no test of the "
        "lanes that ran: remove it, or fix the pattern; did you mean "
        "'broadcast[factories.py:raises-gloo-2]'?"
    ) in run.stdout
