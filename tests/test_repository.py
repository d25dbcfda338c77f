"""The README's test command is the one CI runs, and what the checks print of it."""

import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import conftest

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


def _slowest() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("slowest", REPO / "tools" / "slowest.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["slowest"] = module  # its attrs classes look their module up
    spec.loader.exec_module(module)
    return module


def _case(file: str, seconds: float, cpu: float, interpreters: int) -> str:
    return (
        f'<testcase classname="x" name="t{seconds}" time="{seconds}"><properties>'
        f'<property name="cpu" value="{cpu}" /><property name="interpreters" '
        f'value="{interpreters}" /><property name="file" value="{file}" />'
        "</properties></testcase>"
    )


def test_the_summary_gives_each_files_time_cpu_and_interpreters_and_the_budget_holds_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "pytest.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        + _case("tests/test_a.py", 9.0, 1.5, 4)
        + _case("tests/test_a.py", 3.0, 2.5, 2)
        + _case("tests/test_b.py", 20.0, 0.25, 0)
        + "</testsuite></testsuites>"
    )
    slowest = _slowest()

    assert slowest.main(["--count", "1", "--files", "5", str(report)]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index(" test time      CPU  interp.  tests  file") + 1 :]
    assert table == [
        "       20s       0s        0      1  tests/test_b.py",
        "       12s       4s        6      2  tests/test_a.py",
        "       32s       4s        6      3  every file",
    ]

    budget = tmp_path / "interpreters.toml"
    assert slowest.main(["--write-budget", str(budget), str(report)]) == 0
    assert slowest.read_budget(budget) == {"tests/test_a.py": 6}
    assert slowest.main(["--budget", str(budget), str(report)]) == 0
    assert "interpreters started: 6, within the budget of 6" in capsys.readouterr().out

    # One more start than kept fails, naming the file and the total, and the fix.
    budget.write_text('[files]\n"tests/test_a.py" = 5\n')
    assert slowest.main(["--budget", str(budget), str(report)]) == 1
    said = capsys.readouterr().out
    assert "over the budget: tests/test_a.py: 6 interpreters started, 5 in the budget" in said
    assert "over the budget: every file: 6 interpreters started, 5 in the budget" in said
    assert f"python tools/slowest.py --write-budget {budget}" in said
    # A file that starts interpreters and is not in the budget at all is over it.
    budget.write_text('[files]\n"tests/test_b.py" = 9\n')
    assert slowest.main(["--budget", str(budget), str(report)]) == 1
    assert "tests/test_a.py: 6 interpreters started, 0 in the budget" in capsys.readouterr().out


def test_every_interpreter_of_the_environment_notes_its_start_where_it_is_asked_to(
    tmp_path: Path,
) -> None:
    # What the interpreter budget counts: tools/bootstrap installs the hook into .venv.
    log = tmp_path / "starts.log"
    # The second a program of three lines: one interpreter, whatever its command line.
    nested = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass\\n\\npass'])"
    subprocess.run(
        [sys.executable, "-c", nested],
        env={**os.environ, "PLAIT_STARTS_LOG": str(log)},
        check=True,
        timeout=60,
    )

    started: dict[str, tuple[str, str]] = {}
    for line in log.read_text().splitlines():
        process, parent, command = [*line.split(" ", 2), "", ""][:3]
        if process.isdigit() and parent.isdigit():
            started.setdefault(process, (parent, command))
    assert len(started) == 2, log.read_text()
    (first, (_, first_command)), (_, (second_parent, second_command)) = started.items()
    assert first_command.endswith(nested)
    assert second_parent == first  # each names its parent
    assert second_command.endswith("-c pass")
    # The count the budget holds: the root conftest.py's, from the same log.
    assert conftest.interpreters_started(log) == [
        first_command,
        second_command,
    ]
