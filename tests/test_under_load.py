"""tools/under_load.py: which tests of a run under load failed, from its JUnit report."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "under_load.py"
_spec = importlib.util.spec_from_file_location("under_load", TOOL)
assert _spec is not None
assert _spec.loader is not None
under_load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(under_load)  # a script of tools/, loaded by its path


def test_the_failed_and_errored_tests_of_a_report_are_named(tmp_path: Path) -> None:
    report = tmp_path / "run.xml"
    report.write_text(
        """<testsuites><testsuite>
        <testcase classname="tests.reliability.test_failures" name="test_ok"/>
        <testcase classname="tests.reliability.test_failures" name="test_late">
          <failure message="timed out"/></testcase>
        <testcase classname="tests.multinode.test_hosts" name="test_setup"><error/></testcase>
        <testcase classname="tests.multinode.test_hosts" name="test_skip"><skipped/></testcase>
        </testsuite></testsuites>"""
    )

    assert under_load._failed(report) == [
        "tests.reliability.test_failures::test_late",
        "tests.multinode.test_hosts::test_setup",
    ]
    assert under_load._failed(tmp_path / "none.xml") == ["(no report: pytest did not finish)"]


@pytest.mark.parametrize("bad", [["--runs", "0", "tests"], ["--busy", "-1", "tests"]])
def test_nonsense_counts_are_refused(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        under_load.main(bad)
    assert stopped.value.code == 2
