"""Counts and the slowest tests of JUnit XML files, as tools/check's summary prints them.

    python tools/slowest.py --count 5 .cache/check/pytest.xml .cache/check/xla.xml

A test's time is pytest's for its set-up, call and tear-down together; its CPU time
is the ``cpu`` property the repository's conftest.py records (the test's process and
the processes it waited for), where present.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree


def _outcome(case: ElementTree.Element) -> str:
    for child, outcome in (("skipped", "skipped"), ("failure", "failed"), ("error", "error")):
        if case.find(child) is not None:
            return outcome
    return "passed"


def counts(path: Path) -> Counter[str]:
    """How many of ``path``'s test cases passed, failed, errored and were skipped."""
    return Counter(_outcome(case) for case in ElementTree.parse(path).getroot().iter("testcase"))


def _cpu(case: ElementTree.Element) -> float | None:
    for prop in case.iter("property"):
        if prop.get("name") == "cpu":
            return float(prop.get("value", "0"))
    return None


def slowest(paths: list[Path], count: int, *, by_cpu: bool = False) -> list[tuple[float, str]]:
    """The ``count`` longest test cases of ``paths``: (seconds, test id), longest first.

    With ``by_cpu``, by CPU seconds instead (cases without the ``cpu`` property left out).
    """
    cases = []
    for path in paths:
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            seconds = _cpu(case) if by_cpu else float(case.get("time", "0"))
            if seconds is not None:
                cases.append((seconds, test))
    return sorted(cases, reverse=True)[:count]


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("paths", type=Path, nargs="+")
    options = parser.parse_args(argv)
    paths = [path for path in options.paths if path.is_file()]
    for path in paths:
        found = counts(path)
        listed = ", ".join(
            f"{found[key]} {key}" for key in ("passed", "failed", "error", "skipped")
        )
        print(f"{path.name}: {sum(found.values())} tests: {listed}")
    print(f"\nthe {options.count} slowest tests (set-up, call and tear-down):")
    for seconds, test in slowest(paths, options.count):
        print(f"{seconds:8.1f}s  {test}")
    by_cpu = slowest(paths, options.count, by_cpu=True)
    if by_cpu:
        total = sum(seconds for seconds, _ in slowest(paths, 10**9, by_cpu=True))
        print(f"\nCPU time of the tests: {total:.0f} s; the {options.count} that took most:")
        for seconds, test in by_cpu:
            print(f"{seconds:8.1f}s  {test}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
