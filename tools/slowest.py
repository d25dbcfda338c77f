"""Counts, the slowest tests and the cost of each test file, from JUnit XML files, as
tools/check's summary prints them; and the check of the interpreters the tests start
against the budget kept in the repository.

    python tools/slowest.py --count 5 --files 15 .cache/check/pytest.xml .cache/check/xla.xml
    python tools/slowest.py --budget tests/interpreters.toml .cache/check/pytest.xml
    python tools/slowest.py --write-budget tests/interpreters.toml .cache/check/pytest.xml

A test's time is pytest's for its set-up, call and tear-down together; its CPU time
is the ``cpu`` property the repository's conftest.py records (the test's process and
the processes it waited for), and its interpreters the ``interpreters`` property (the
Python processes of the environment that started during the test), where present.

The budget is a count, not a time: a change that makes the tests start more
interpreters fails the check until its diff raises the file's number, so that the cost
is seen where it is added. Fewer than the budget passes, with a line saying by how much.
"""

from __future__ import annotations

import argparse
import tomllib
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

import attrs


def _outcome(case: ElementTree.Element) -> str:
    for child, outcome in (("skipped", "skipped"), ("failure", "failed"), ("error", "error")):
        if case.find(child) is not None:
            return outcome
    return "passed"


def counts(path: Path) -> Counter[str]:
    """How many of ``path``'s test cases passed, failed, errored and were skipped."""
    return Counter(_outcome(case) for case in ElementTree.parse(path).getroot().iter("testcase"))


def _property(case: ElementTree.Element, name: str) -> str | None:
    for prop in case.iter("property"):
        if prop.get("name") == name:
            return prop.get("value", "")
    return None


def _cpu(case: ElementTree.Element) -> float | None:
    value = _property(case, "cpu")
    return None if value is None else float(value or "0")


def _cases(paths: list[Path]) -> list[ElementTree.Element]:
    return [case for path in paths for case in ElementTree.parse(path).getroot().iter("testcase")]


def slowest(paths: list[Path], count: int, *, by_cpu: bool = False) -> list[tuple[float, str]]:
    """The ``count`` longest test cases of ``paths``: (seconds, test id), longest first.

    With ``by_cpu``, by CPU seconds instead (cases without the ``cpu`` property left out).
    """
    cases = []
    for case in _cases(paths):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        seconds = _cpu(case) if by_cpu else float(case.get("time", "0"))
        if seconds is not None:
            cases.append((seconds, test))
    return sorted(cases, reverse=True)[:count]


@attrs.define
class FileCost:
    """What the tests of one file took together."""

    tests: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    interpreters: int = 0


def by_file(paths: list[Path]) -> dict[str, FileCost]:
    """Each test file's cost (from the ``file`` property; the class name where absent)."""
    files: dict[str, FileCost] = {}
    for case in _cases(paths):
        name = _property(case, "file") or case.get("classname") or ""
        cost = files.setdefault(name, FileCost())
        cost.tests += 1
        cost.seconds += float(case.get("time", "0"))
        cost.cpu += _cpu(case) or 0.0
        cost.interpreters += int(_property(case, "interpreters") or "0")
    return files


def print_files(paths: list[Path], count: int) -> None:
    """The ``count`` files whose tests took longest, with their CPU time and interpreters."""
    files = by_file(paths)
    total = FileCost(
        sum(cost.tests for cost in files.values()),
        sum(cost.seconds for cost in files.values()),
        sum(cost.cpu for cost in files.values()),
        sum(cost.interpreters for cost in files.values()),
    )
    print(f"\nthe {count} test files that took longest (of {len(files)}):")
    print(f"{'test time':>10} {'CPU':>8} {'interp.':>8} {'tests':>6}  file")
    ranked = sorted(files.items(), key=lambda item: item[1].seconds, reverse=True)
    for name, cost in [*ranked[:count], ("every file", total)]:
        print(
            f"{cost.seconds:9.0f}s {cost.cpu:7.0f}s {cost.interpreters:8d} {cost.tests:6d}  {name}"
        )


def read_budget(path: Path) -> dict[str, int]:
    """The interpreters each file may start, as kept in ``path`` (its ``[files]`` table)."""
    files = tomllib.loads(path.read_text()).get("files", {})
    return {str(name): int(count) for name, count in files.items()}


def interpreters(paths: list[Path]) -> dict[str, int]:
    """The interpreters each test file's tests started."""
    return {name: cost.interpreters for name, cost in by_file(paths).items()}


def check_budget(started: dict[str, int], budget: dict[str, int]) -> list[str]:
    """What exceeds ``budget``: a line for each file that ``started`` more interpreters
    than it may, and for the total; empty when within it."""
    over = [
        f"{name}: {count} interpreters started, {budget.get(name, 0)} in the budget"
        for name, count in sorted(started.items())
        if count > budget.get(name, 0)
    ]
    total, allowed = sum(started.values()), sum(budget.values())
    if total > allowed:
        over.append(f"every file: {total} interpreters started, {allowed} in the budget")
    return over


def write_budget(started: dict[str, int], path: Path) -> None:
    """Keep the interpreters each file ``started`` in ``path``, as the new budget."""
    kept = {name: count for name, count in started.items() if count}
    lines = [
        "# The Python interpreters each test file may start in the check's pytest run",
        "# (tools/check; conftest.py counts them). A change that starts more raises the",
        "# file's number here, in its own diff: python tools/slowest.py --write-budget",
        f"# {path.as_posix()} .cache/check/pytest.xml (every file, from a whole run).",
        f"# In all: {sum(kept.values())}.",
        "",
        "[files]",
        *(f'"{name}" = {count}' for name, count in sorted(kept.items())),
    ]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5, help="slowest tests to list")
    parser.add_argument("--files", type=int, default=0, help="costliest test files to list")
    parser.add_argument("--budget", type=Path, help="check the interpreters against this file")
    parser.add_argument("--write-budget", type=Path, help="write the interpreters to this file")
    parser.add_argument("paths", type=Path, nargs="+")
    options = parser.parse_args(argv)
    paths = [path for path in options.paths if path.is_file()]
    if options.write_budget is not None:
        write_budget(interpreters(paths), options.write_budget)
        return 0
    if options.budget is not None:
        budget = read_budget(options.budget)
        started = interpreters(paths)
        over = check_budget(started, budget)
        for line in over:
            print(f"over the budget: {line}")
        if over:
            print(
                f"If the new starts are needed, raise their numbers in {options.budget} "
                f"(python tools/slowest.py --write-budget {options.budget} "
                f"{' '.join(map(str, options.paths))})."
            )
            return 1
        print(
            f"interpreters started: {sum(started.values())}, "
            f"within the budget of {sum(budget.values())}"
        )
        return 0
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
    if options.files:
        print_files(paths, options.files)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
