"""The README's test command is the one CI runs."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ci_runs_exactly_the_test_command_of_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Run every check", 1)[1]
    command = re.search(r"```bash\n(.+?)\n```", section, re.DOTALL)
    ci = (REPO / ".ci" / "run").read_text().splitlines()

    assert command is not None
    assert f"exec {command.group(1)}" in ci


def test_test_modules_have_names_unique_across_packages() -> None:
    # Pants names a module by its source root: packages/<name>/tests/x.py and
    # tests/x.py are both "tests.x", and mypy under Pants refuses duplicates.
    directories = [*sorted(REPO.glob("packages/*/tests")), REPO / "tests"]
    seen: dict[str, Path] = {}
    for directory in directories:
        for module in sorted(directory.glob("*.py")):
            other = seen.setdefault(module.name, module)
            assert other == module, f"{module} and {other} would both be tests.{module.stem}"
