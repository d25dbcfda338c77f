"""Print the slowest tests of one or more JUnit XML files, as tools/check's summary does.

    python tools/slowest.py --count 5 .cache/check/pytest.xml .cache/check/xla.xml

A test's time is pytest's for its set-up, call and tear-down together.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from xml.etree import ElementTree


def slowest(paths: list[Path], count: int) -> list[tuple[float, str]]:
    """The ``count`` longest test cases of ``paths``: (seconds, test id), longest first."""
    cases = []
    for path in paths:
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time", "0")), test))
    return sorted(cases, reverse=True)[:count]


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("paths", type=Path, nargs="+")
    options = parser.parse_args(argv)
    for seconds, test in slowest([p for p in options.paths if p.is_file()], options.count):
        print(f"{seconds:8.1f}s  {test}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
