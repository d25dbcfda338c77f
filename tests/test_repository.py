"""The README's test command is the one CI runs, and what the checks print of it."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def readme_command(heading: str) -> str:
    section = (REPO / "README.md").read_text().split(f"## {heading}", 1)[1]
    command = re.search(r"```bash\n(.+?)\n```", section, re.DOTALL)
    assert command is not None, f"no command under {heading!r}"
    return command.group(1)


def test_the_readme_train_command_is_an_executable_of_the_repository() -> None:
    command = readme_command("Train the example").split()[0]

    assert (REPO / command).is_file()
    assert (REPO / command).stat().st_mode & 0o111


def test_ci_runs_exactly_the_test_command_of_the_readme() -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()

    assert f"exec {readme_command('Run every check')}" in ci


def test_test_modules_have_names_unique_across_packages() -> None:
    # Pants names a module by its source root: packages/<name>/tests/x.py and
    # tests/x.py are both "tests.x", and mypy under Pants refuses duplicates.
    directories = [*sorted(REPO.glob("packages/*/tests")), REPO / "tests"]
    seen: dict[str, Path] = {}
    for directory in directories:
        for module in sorted(directory.glob("*.py")):
            other = seen.setdefault(module.name, module)
            assert other == module, f"{module} and {other} would both be tests.{module.stem}"


def test_every_python_directory_has_a_pants_build_file() -> None:
    # Pants checks and packages only the files a BUILD target owns.
    roots = [REPO / "packages", REPO / "tests", REPO / "examples"]
    directories = {path.parent for root in roots for path in root.rglob("*.py")}
    missing = sorted(str(d.relative_to(REPO)) for d in directories if not (d / "BUILD").is_file())

    assert missing == []


def test_the_checks_summary_lists_the_slowest_tests_and_those_that_took_most_cpu(
    tmp_path: Path,
) -> None:
    report = tmp_path / "pytest.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.a" name="test_waits" time="9.0">'
        '<properties><property name="cpu" value="0.50" /></properties></testcase>'
        '<testcase classname="tests.a" name="test_computes" time="2.0">'
        '<properties><property name="cpu" value="7.25" /></properties></testcase>'
        '<testcase classname="tests.b" name="test_skipped" time="0.0"><skipped /></testcase>'
        "</testsuite></testsuites>"
    )
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "slowest.py"), "--count", "1", str(report)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "pytest.xml: 3 tests: 2 passed, 0 failed, 0 error, 1 skipped"
    assert "     9.0s  tests.a::test_waits" in lines
    assert "CPU time of the tests: 8 s; the 1 that took most:" in lines
    assert lines[-1] == "     7.2s  tests.a::test_computes"
