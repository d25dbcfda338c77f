"""Check that each package installs and imports on its own, from its wheel.

Builds one wheel per package into dist/, then for every package makes a fresh
virtualenv, installs that package's wheel (pip resolves plait-core and any other
sibling it declares from the wheels just built, nothing else), and imports it.

Third-party dependencies (torch above all) come from one shared base environment,
made once per machine (under ~/.cache/plait) and reused while the packages'
dependencies and the Python are unchanged, which each fresh virtualenv sees
through a .pth file. The base holds no plait package, so a
sibling that a package imports without declaring it fails the import.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
TORCH_PIN = "torch==2.13.0"  # the CPU build on these machines, as in requirements/dev.txt
# The machine's cache, as the XLA lane's environment is: a fresh clone reuses the base.
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "plait" / "wheel-check"


def run(*command: str | Path, cwd: Path = REPO) -> str:
    """Run a command, failing with its output if it fails."""
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        sys.exit(
            f"command failed ({result.returncode}): {' '.join(map(str, command))}\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result.stdout


def packages() -> dict[str, list[Requirement]]:
    """Each package directory with the requirements its pyproject.toml declares."""
    found = {}
    for pyproject in sorted(REPO.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        found[pyproject.parent.name] = [Requirement(text) for text in project["dependencies"]]
    return found


def build_wheels(dist: Path) -> None:
    """Build every package's wheel into ``dist``."""
    shutil.rmtree(dist, ignore_errors=True)
    for package in packages():
        run(
            sys.executable, "-m", "build", "--wheel", "--no-isolation",
            "--outdir", dist, REPO / "packages" / package,
        )  # fmt: skip


def base_environment(cache: Path) -> Path:
    """A virtualenv with every third-party dependency of every package; its site-packages."""
    third_party = sorted(
        {
            str(req)
            for reqs in packages().values()
            for req in reqs
            if not req.name.startswith("plait-")
        }
        | {TORCH_PIN}
    )
    made_of = [sys.version, *third_party]
    key = hashlib.sha256("\n".join(made_of).encode()).hexdigest()[:16]
    base = cache / f"base-{key}"
    cache.mkdir(parents=True, exist_ok=True)
    # Two checks at once (two clones on one machine) take turns: one makes the
    # base, the other finds it complete.
    with (cache / f"base-{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / ".complete").exists():
            shutil.rmtree(base, ignore_errors=True)
            print(f"wheels: making the base environment with {', '.join(third_party)}")
            venv.create(base, with_pip=False)
            python = base / "bin" / "python"
            run(
                sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
                *third_party,
            )  # fmt: skip
            (base / ".complete").touch()
    return next((base / "lib").glob("python3.*/site-packages"))


# Imports the package, checks its py.typed marker, and lists the installed plait-*.
IMPORT_PROBE = """
import importlib.metadata, importlib.resources, plait.PACKAGE
assert importlib.resources.files("plait.PACKAGE").joinpath("py.typed").is_file(), "no py.typed"
names = {dist.metadata["Name"] for dist in importlib.metadata.distributions()}
print(", ".join(sorted(name for name in names if name.startswith("plait-"))))
"""

# With plait-core alone, looking a strategy up must say which distribution to install.
MISSING_PROVIDER_PROBE = """
from plait.core import MissingDependencyError, StrategyRegistry
try:
    StrategyRegistry.get("ddp")
except MissingDependencyError as error:
    assert error.install == "plait-strategies", error
else:
    raise AssertionError("no MissingDependencyError")
"""


def check_package(package: str, dist: Path, base_site: Path, workdir: Path) -> None:
    """Install ``package`` from its wheel into a fresh virtualenv and import it."""
    env_dir = workdir / package
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = next((env_dir / "lib").glob("python3.*/site-packages"))
    (site / "plait-base.pth").write_text(f"{base_site}\n")
    distribution = "plait-" + package.replace("_", "-")
    run(
        sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
        "--no-index", "--find-links", dist, distribution,
    )  # fmt: skip
    plait = run(python, "-c", IMPORT_PROBE.replace("PACKAGE", package), cwd=workdir).strip()
    print(f"  {distribution:<22} installs with {plait} and imports")
    if package == "core":
        run(python, "-c", MISSING_PROVIDER_PROBE, cwd=workdir)
        print("  plait-core alone: a strategy lookup names plait-strategies to install")
    if package == "strategies":
        run(python, "-c", PARTS_PROBE, cwd=workdir)
        print("  plait-strategies alone: a strategy names every missing part at once")


WITHOUT_TRAINER = ("plait-strategies[parts]",)
"""The strategies and every part they are built from by name, through the extra."""

PARTS_PROBE = """
from plait.core import MissingDependencyError
from plait.strategies import DDPStrategy
try:
    DDPStrategy()
except MissingDependencyError as error:
    assert error.install == "plait-strategies[parts]", error
    for part in ("accelerators", "precision", "checkpoint-io", "environments"):
        assert f"plait-{part}" in str(error), error
else:
    raise AssertionError("no MissingDependencyError")
"""


def check_example_without_trainer(dist: Path, base_site: Path, workdir: Path) -> None:
    """Run the standalone DDP example where every part is installed but the trainer."""
    env_dir = workdir / "without-trainer"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = next((env_dir / "lib").glob("python3.*/site-packages"))
    (site / "plait-base.pth").write_text(f"{base_site}\n")
    run(
        sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
        "--no-index", "--find-links", dist, *WITHOUT_TRAINER,
    )  # fmt: skip
    run(python, "-c", "import importlib.util as u; assert u.find_spec('plait.trainer') is None")
    output = run(
        python, REPO / "examples" / "ddp_standalone.py",
        "--processes", "2", "--epochs", "1", "--checkpoint", workdir / "example.pt",
        cwd=workdir,
    )  # fmt: skip
    if "final loss" not in output:
        sys.exit(f"the example did not report its final loss:\n{output}")
    print(
        "  examples/ddp_standalone.py trains with DDP on 2 processes from "
        "plait-strategies[parts], without plait-trainer"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=REPO / "dist", help="where wheels go")
    parser.add_argument(
        "--cache",
        type=Path,
        default=CACHE,
        help="where the shared base environment is kept (the machine's, like the XLA "
        "lane's: a fresh clone reuses it)",
    )
    args = parser.parse_args()
    start = time.monotonic()
    build_wheels(args.dist)
    print(f"wheels: built {len(list(args.dist.glob('*.whl')))} wheels into {args.dist}")
    base_site = base_environment(args.cache)
    with tempfile.TemporaryDirectory(prefix="plait-wheel-check-") as workdir:
        for package in packages():
            check_package(package, args.dist, base_site, Path(workdir))
        check_example_without_trainer(args.dist, base_site, Path(workdir))
    print(
        f"wheels: every package installs and imports on its own ({time.monotonic() - start:.0f} s)"
    )


if __name__ == "__main__":
    main()
