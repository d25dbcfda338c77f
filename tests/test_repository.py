"""The README's test command is the one CI runs."""

import re
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
