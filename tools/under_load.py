"""Run test suites several times with busy processes beside them, and count what failed.

    python tools/under_load.py --runs 5 --busy 2 tests/reliability tests/multinode

Tests bounded by time must hold on a machine slower or busier than the one they were
written on. This starts ``--busy`` processes that spin on the CPU for as long as the
suites run (two of them take a two-core machine's every core), runs pytest on the
given paths ``--runs`` times (with ``-n 2``, as ``tools/check`` does), and prints, per
run, its status, its time and the tests that failed; then each failing test's count.
It exits non-zero if any run failed. ``--reports DIR`` keeps each run's JUnit XML
report (``run-N.xml``), which holds each failure's output.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent


def _failed(report: Path) -> list[str]:
    """The test ids that failed or errored in the JUnit XML ``report``."""
    if not report.is_file():
        return ["(no report: pytest did not finish)"]
    return [
        f"{case.get('classname', '')}::{case.get('name', '')}"
        for case in ElementTree.parse(report).getroot().iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="times to run the suites")
    parser.add_argument("--busy", type=int, default=2, help="processes that spin beside them")
    parser.add_argument("--workers", default="2", help="pytest-xdist workers (-n)")
    parser.add_argument(
        "--reports", type=Path, default=None, help="keep each run's JUnit XML report here"
    )
    parser.add_argument("paths", nargs="+", help="test paths, as pytest takes them")
    options = parser.parse_args(argv)
    if options.runs < 1 or options.busy < 0:
        parser.error("--runs must be at least 1 and --busy at least 0")
    spinning = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(options.busy)
    ]
    failures: Counter[str] = Counter()
    bad_runs = 0
    try:
        with tempfile.TemporaryDirectory(prefix="plait-under-load-") as scratch:
            folder = options.reports or Path(scratch)
            folder.mkdir(parents=True, exist_ok=True)
            for run in range(1, options.runs + 1):
                report = folder / f"run-{run}.xml"
                started = time.monotonic()
                done = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "-n", options.workers, "--dist", "loadgroup", f"--junitxml={report}",
                     *options.paths],
                    cwd=ROOT, capture_output=True, text=True, check=False,
                )  # fmt: skip
                failed = _failed(report) if done.returncode != 0 else []
                failures.update(failed)
                bad_runs += done.returncode != 0
                status = "passed" if done.returncode == 0 else f"FAILED ({len(failed)})"
                print(f"run {run}: {status} in {time.monotonic() - started:.0f} s", flush=True)
                for test in failed:
                    print(f"    {test}", flush=True)
    finally:
        for process in spinning:
            process.kill()
            process.wait()
    print(f"\n{options.runs - bad_runs} of {options.runs} runs passed with {options.busy} busy "
          f"process(es) beside them")  # fmt: skip
    for test, count in failures.most_common():
        print(f"{count:4d}x  {test}")
    return 1 if bad_runs else 0


if __name__ == "__main__":
    raise SystemExit(main())
