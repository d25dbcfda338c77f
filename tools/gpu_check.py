"""plait's CUDA and NCCL lanes, on a machine with a GPU and no network.

Here, on a development machine (the project's ``.venv``, with network):

    tools/gpu-check --prepare

builds a wheel of every plait package, and downloads or builds each pinned
dependency that a GPU machine's image may lack, into ``.gpu-wheels/`` (under 64 MiB,
no torch in it). There, on the GPU machine (any Python 3.10+ whose torch is built
for CUDA; the folder travels with the working tree):

    tools/gpu-check

installs those wheels into a folder of their own on the path (``--site``), never
into the machine's environment and never a torch, then runs each lane and writes a
report (``--report``; JSON, and the same as text beside it): the device, torch,
CUDA and NCCL versions, each lane's passed, failed and skipped tests with the
reasons for skips, and the benchmark's GPU rows.

The lanes, for one GPU:

- ``cuda-tests``: every test marked ``cuda`` (the accelerator, placement by UUID,
  ``16-mixed`` with gradient scaling and ``bf16-mixed`` training, DDP at world size 1
  on NCCL, two processes sharing the GPU over gloo, FSDP and DeepSpeed on CUDA).
- ``conformance-nccl``: the conformance suite on NCCL at world size 1.
- ``conformance-gloo-cuda``: the suite with two ranks sharing the GPU over gloo,
  their tensors on CUDA.
- ``bench``: the FSDP and DeepSpeed benchmarks on the GPU, with CUDA peak memory.

Where there is no GPU every lane still runs, and its tests skip, each saying why:
the report says so too. Exit status: 0 when no test failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from xml.etree import ElementTree

REPO: Final = Path(__file__).resolve().parent.parent
DEFAULT_WHEELS: Final = REPO / ".gpu-wheels"
LIMIT_BYTES: Final = 64 * 1024 * 1024
MANIFEST: Final = "manifest.json"

# What a GPU machine's image may lack, or hold at another version than the one
# plait is checked with. Pure Python, except pydantic-core, fetched for CPython 3.12
# on x86-64 (--python-version, --platform). torch is never among them.
CARRIED: Final = (
    "attrs", "typing_extensions", "fsspec", "rich", "markdown-it-py", "mdurl", "pygments",
    "hypothesis", "sortedcontainers", "pytest", "pluggy", "iniconfig", "packaging",
    "pytest-xdist", "execnet", "pytest-timeout",
    "deepspeed", "hjson", "pydantic", "pydantic_core", "annotated-types", "typing-inspection",
)  # fmt: skip
TARGET_PYTHON: Final = "3.12"
TARGET_PLATFORMS: Final = (
    "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
)  # fmt: skip
# With the machine's plugins left out, the ones plait's tests use, named.
PLUGINS: Final = (
    "xdist.plugin", "xdist.looponfail", "pytest_timeout", "_hypothesis_pytestplugin",
    "plait.conformance.plugin",
)  # fmt: skip


@dataclass(frozen=True)
class Lane:
    """One lane: what it runs, and why it is there.

    ``workers`` pytest-xdist workers run it where there is a GPU; none elsewhere,
    where every test skips.
    """

    name: str
    about: str
    arguments: tuple[str, ...]
    workers: int = 0


def _test_directories() -> list[str]:
    return [str(path.relative_to(REPO)) for path in sorted(REPO.glob("packages/*/tests"))] + [
        "tests"
    ]


def lanes(report_dir: Path) -> dict[str, Lane]:
    """Every lane, by name; conformance reports go under ``report_dir``."""
    suite = ("--pyargs", "plait.conformance.suite")
    shared = "tests/gpu/shared_gpu.py"
    nccl = ("ddp", "fsdp", "deepspeed")
    return {
        "cuda-tests": Lane(
            "cuda-tests", "every test marked cuda", ("-m", "cuda", *_test_directories()), 4
        ),
        "conformance-nccl": Lane(
            "conformance-nccl",
            "the conformance suite on NCCL, one rank on the GPU",
            (
                *suite,
                "--plait-backend=nccl",
                "--plait-world-sizes=1",
                *(f"--plait-strategy={name}" for name in nccl),
                f"--plait-report-dir={report_dir / 'nccl'}",
            ),
            len(nccl),
        ),
        "conformance-gloo-cuda": Lane(
            "conformance-gloo-cuda",
            "the conformance suite on gloo, two ranks sharing the GPU with CUDA tensors",
            (
                *suite,
                "--plait-backend=gloo-cuda",
                "--plait-world-sizes=2",
                *(f"--plait-strategy={shared}:{name}" for name in ("ddp", "fsdp")),
                f"--plait-report-dir={report_dir / 'gloo-cuda'}",
            ),
            2,
        ),
    }


# Preparing (here) ------------------------------------------------------------------


def _run(command: Sequence[str | Path], **kwargs: object) -> str:
    done = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, check=False, **kwargs
    )  # type: ignore[call-overload]
    if done.returncode != 0:
        sys.exit(
            f"gpu-check: command failed ({done.returncode}): {' '.join(map(str, command))}\n"
            f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    output: str = done.stdout
    return output


def _pins() -> dict[str, str]:
    """Each dependency's version in requirements/constraints.txt, by normalised name."""
    pins = {}
    for line in (REPO / "requirements" / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not name.startswith("#"):
            pins[_normal(name)] = version.strip()
    return pins


def _normal(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def _projects() -> list[Path]:
    """Every plait package, and the example strategy plugin the tests install."""
    return sorted(REPO.glob("packages/*/pyproject.toml")) + sorted(
        REPO.glob("tests/plugins/*/pyproject.toml")
    )


def prepare(out: Path, python: str = TARGET_PYTHON) -> dict[str, object]:
    """Build and fetch the wheels into ``out`` (emptied first) for Python ``python``.

    Returns:
        The manifest, also written to ``out``.
    """
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check")
    projects = [project.parent for project in _projects()]
    _run((*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "--wheel-dir", out, *projects))  # fmt: skip
    pins = _pins()
    missing = [name for name in CARRIED if _normal(name) not in pins]
    if missing:
        sys.exit(f"gpu-check: no pin in requirements/constraints.txt for {', '.join(missing)}")
    wanted = [f"{name}=={pins[_normal(name)]}" for name in CARRIED]
    with tempfile.TemporaryDirectory() as scratch:
        # A pure-Python wheel serves any Python; an sdist (deepspeed) is built here
        # into one, without compiling anything (DeepSpeed builds its ops on first use).
        _run((*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation",
              "--wheel-dir", scratch, *wanted))  # fmt: skip
        pure = set()
        for wheel in Path(scratch).glob("*.whl"):
            if wheel.name.endswith("-none-any.whl"):
                shutil.copy2(wheel, out)
                pure.add(_normal(wheel.name.split("-")[0]))
        # The others are built for this machine's Python: fetched for the GPU machine's.
        platforms = [f"--platform={name}" for name in TARGET_PLATFORMS]
        binary = [name for name in wanted if _normal(name.partition("==")[0]) not in pure]
        if binary:
            _run((*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:",
                  f"--python-version={python}", "--implementation=cp", *platforms,
                  "--dest", out, *binary))  # fmt: skip
    wheels = sorted(out.glob("*.whl"))
    torch_wheels = [wheel.name for wheel in wheels if wheel.name.lower().startswith("torch-")]
    if torch_wheels:
        sys.exit(
            f"gpu-check: a torch wheel was fetched ({torch_wheels}): the lanes use the machine's"
        )
    size = sum(wheel.stat().st_size for wheel in wheels)
    if size > LIMIT_BYTES:
        sys.exit(
            f"gpu-check: the wheels take {size / 2**20:.1f} MiB, over the 64 MiB a call carries"
        )
    manifest: dict[str, object] = {
        "commit": _commit(),
        "made": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": python,
        "bytes": size,
        "wheels": {wheel.name: hashlib.sha256(wheel.read_bytes()).hexdigest() for wheel in wheels},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else "unknown"


# Running (there) -------------------------------------------------------------------


def install(wheels: Path, site: Path) -> None:
    """Install every wheel of ``wheels`` into ``site``, which is emptied first."""
    manifest = wheels / MANIFEST
    if not manifest.is_file():
        sys.exit(
            f"gpu-check: {wheels} holds no {MANIFEST}: run `tools/gpu-check --prepare` on a "
            "machine with the network first, and bring the folder along"
        )
    made = json.loads(manifest.read_text())
    listed = made["wheels"]
    here = ".".join(platform.python_version_tuple()[:2])
    if made["python"] != here:
        sys.exit(
            f"gpu-check: the wheels in {wheels} were prepared for Python {made['python']}, and "
            f"this is Python {here}: run `tools/gpu-check --prepare --python-version {here}`"
        )
    found = sorted(wheels.glob("*.whl"))
    if {wheel.name for wheel in found} != set(listed):
        sys.exit(f"gpu-check: {wheels} does not hold the wheels its manifest lists; prepare again")
    shutil.rmtree(site, ignore_errors=True)
    _run((sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
          "--no-index", "--no-deps", "--no-compile", "--target", site, *found))  # fmt: skip
    if (site / "torch").exists():
        sys.exit(f"gpu-check: a torch was installed into {site}; the lanes must use the machine's")


def _environment(site: Path) -> dict[str, str]:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    path = [str(site), environ.get("PYTHONPATH", "")]
    environ["PYTHONPATH"] = os.pathsep.join(part for part in path if part)
    # The machine's own pytest plugins stay out; plait's tests name theirs.
    environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    environ.setdefault("TORCH_EXTENSIONS_DIR", str(site.parent / "plait-gpu-extensions"))
    return environ


PROBE: Final = """
import json, os, torch, torch.distributed
import plait.core
cuda = torch.cuda.is_available()
nccl = None
if cuda and torch.distributed.is_nccl_available():
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
print(json.dumps({
    "torch": torch.__version__,
    "torch_path": torch.__file__,
    "plait_path": os.path.dirname(plait.core.__file__),
    "cuda": torch.version.cuda,
    "cuda_available": cuda,
    "nccl": nccl,
    "devices": [
        {"name": torch.cuda.get_device_name(i),
         "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
         "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))}
        for i in range(torch.cuda.device_count())
    ],
}))
"""


def probe(environ: dict[str, str]) -> dict[str, object]:
    """What the machine's torch sees: versions and devices."""
    found: dict[str, object] = json.loads(
        _run((sys.executable, "-c", PROBE), env=environ, cwd=REPO).strip().splitlines()[-1]
    )
    return found


@dataclass
class LaneResult:
    """A lane's outcome, read from its JUnit XML."""

    name: str
    about: str
    seconds: float = 0.0
    exit_code: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    skip_reasons: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    output_tail: str = ""


def read_junit(path: Path, result: LaneResult) -> None:
    """Count ``path``'s test cases into ``result``."""
    if not path.is_file():
        return
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        if (skipped := case.find("skipped")) is not None:
            result.skipped += 1
            reason = (skipped.get("message") or "").removeprefix("Skipped: ")
            result.skip_reasons[reason] = result.skip_reasons.get(reason, 0) + 1
        elif case.find("failure") is not None:
            result.failed += 1
            result.failures.append(test)
        elif case.find("error") is not None:
            result.errors += 1
            result.failures.append(test)
        else:
            result.passed += 1


def _bounded(
    command: Sequence[str], environ: dict[str, str], limit: float
) -> tuple[int | None, str]:
    """Run ``command`` for at most ``limit`` seconds: its exit status (None if it ran
    over and was stopped, its whole process group with it) and its output."""
    with subprocess.Popen(
        command, cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    ) as process:  # fmt: skip
        try:
            output, _ = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            return None, output
    return process.returncode, output


def run_lane(
    lane: Lane, environ: dict[str, str], scratch: Path, gpu: bool, limit: float
) -> LaneResult:
    """Run one lane's pytest for at most ``limit`` seconds; its counts and skip reasons."""
    junit = scratch / f"{lane.name}.xml"
    plugins = [argument for name in PLUGINS for argument in ("-p", name)]
    extra = []
    if gpu:
        # Each conformance lane (strategy x backend x size) on one worker, so that its
        # ranks start once; a lane the machine cannot run is an error, not a skip.
        extra += ["-n", str(lane.workers), "--dist", "loadgroup"] if lane.workers else []
        extra += ["--plait-require-lanes"] if "plait.conformance.suite" in lane.arguments else []
    command = [
        sys.executable, "-m", "pytest", *plugins, "-p", "no:cacheprovider",
        f"--junitxml={junit}", "-o", "junit_family=xunit1", "-q", *extra, *lane.arguments,
    ]  # fmt: skip
    start = time.monotonic()
    code, output = _bounded(command, environ, limit)
    result = LaneResult(lane.name, lane.about, seconds=round(time.monotonic() - start, 1))
    result.output_tail = output[-3000:]
    if code is None:
        # Stopped, pytest wrote no JUnit file: the lane failed, and its output says where.
        result.exit_code = -signal.SIGKILL
        result.errors += 1
        result.failures.append(
            f"the lane ran over its {limit:g} s (--lane-timeout) and was stopped"
        )
        return result
    result.exit_code = code
    read_junit(junit, result)
    if code not in (0, 5) and not (result.failed or result.errors):
        # pytest stopped before any test (a usage error, a crash): that is a failure.
        result.errors += 1
        result.failures.append(f"pytest exited {code} before reporting a failure")
    return result


def bench_rows(
    environ: dict[str, str], scratch: Path, gpu: bool, limit: float
) -> tuple[list[object], str]:
    """The benchmark's GPU rows (empty where there is no GPU), and why none."""
    if not gpu:
        return [], "no CUDA device: the GPU rows need one"
    out = scratch / "bench.json"
    code, output = _bounded(
        [sys.executable, str(REPO / "tools" / "bench.py"), "--quick", "--sections",
         "fsdp,deepspeed", "--accelerator", "cuda", "--json", str(out)],
        environ, limit,
    )  # fmt: skip
    if code is None:
        return [], f"tools/bench.py ran over its {limit:g} s (--lane-timeout): {output[-2000:]}"
    if code != 0:
        return [], f"tools/bench.py exited {code}: {output[-2000:]}"
    rows: list[object] = json.loads(out.read_text())["rows"]
    return rows, ""


def render(report: dict[str, object]) -> str:
    """The report as text, for a terminal or a note."""
    lines = [f"# plait gpu-check, {report['made']} (commit {report['commit']})", ""]
    machine = report["machine"]
    assert isinstance(machine, dict)
    devices = machine["devices"] or ["none"]
    lines.append(
        f"device: {', '.join(d['name'] if isinstance(d, dict) else str(d) for d in devices)}"
        f"; torch {machine['torch']} (CUDA {machine['cuda']}), NCCL {machine['nccl']}, "
        f"Python {report['python']}"
    )
    lines += [
        "",
        "| lane | passed | failed | skipped | seconds |",
        "| --- | --- | --- | --- | --- |",
    ]
    results = report["lanes"]
    assert isinstance(results, list)
    for lane in results:
        lines.append(
            f"| {lane['name']} | {lane['passed']} | {lane['failed'] + lane['errors']} | "
            f"{lane['skipped']} | {lane['seconds']} |"
        )
    for lane in results:
        for reason, count in sorted(lane["skip_reasons"].items()):
            lines.append(f"- {lane['name']}: {count} skipped: {reason}")
        for test in lane["failures"]:
            lines.append(f"- {lane['name']}: FAILED {test}")
    bench = report["bench"]
    assert isinstance(bench, dict)
    lines += ["", "bench (GPU rows):"]
    if bench["skipped"]:
        lines.append(f"- skipped: {bench['skipped']}")
    for row in bench["rows"]:
        lines.append(f"- {json.dumps(row)}")
    return "\n".join(lines) + "\n"


def check(wheels: Path, site: Path, report_path: Path, chosen: Sequence[str], limit: float) -> int:
    """Install, run the chosen lanes and the bench, write the report; the exit status.

    The report is written again after each lane, so that a run stopped from outside
    still leaves the lanes it finished.
    """
    install(wheels, site)
    environ = _environment(site)
    machine = probe(environ)
    torch_path = str(machine.pop("torch_path"))
    if torch_path.startswith(str(site)):
        sys.exit(f"gpu-check: torch was imported from {site}, not from the machine's environment")
    if not str(machine["plait_path"]).startswith(str(site)):
        sys.exit(
            f"gpu-check: plait was imported from {machine['plait_path']}, not from the wheels "
            f"in {site}: unset PYTHONPATH entries that hold another plait"
        )
    gpu = bool(machine["cuda_available"])
    scratch = report_path.parent / (report_path.stem + "-files")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    every = lanes(scratch / "conformance")
    names = list(chosen) or [*every, "bench"]
    results: list[LaneResult] = []
    manifest = json.loads((wheels / MANIFEST).read_text())

    def write(rows: list[object], why: str) -> str:
        report: dict[str, object] = {
            "made": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": manifest["commit"],
            "python": platform.python_version(),
            "machine": machine,
            "lanes": [result.__dict__ for result in results],
            "bench": {"rows": rows, "skipped": why},
        }
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(report, indent=2) + "\n")
        text = render(report)
        report_path.with_suffix(".md").write_text(text)
        return text

    for name in (name for name in names if name in every):
        print(f"gpu-check: lane {name} ({every[name].about})", flush=True)
        result = run_lane(every[name], environ, scratch, gpu, limit)
        print(f"gpu-check: {name}: {result.passed} passed, {result.failed + result.errors} "
              f"failed, {result.skipped} skipped in {result.seconds}s", flush=True)  # fmt: skip
        results.append(result)
        write([], "not run yet")
    if "bench" in names:
        print("gpu-check: bench (the FSDP and DeepSpeed benchmarks on the GPU)", flush=True)
        rows, why = bench_rows(environ, scratch, gpu, limit)
    else:
        rows, why = [], "not chosen"
    print(write(rows, why))
    failed = any(result.failed or result.errors for result in results)
    return 1 if failed or (gpu and why.startswith("tools/bench")) else 0


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="tools/gpu-check", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )  # fmt: skip
    parser.add_argument("--prepare", action="store_true", help="build the wheels (here)")
    parser.add_argument(
        "--python-version",
        default=TARGET_PYTHON,
        help=f"with --prepare: the Python the wheels are for (default {TARGET_PYTHON}, the "
        "lent GPU machines')",
    )
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS, help="the wheels' folder")
    out = Path(os.environ.get("OUT", REPO / ".cache"))
    parser.add_argument("--report", type=Path, default=out / "gpu-check.json")
    parser.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "plait-gpu-site")
    parser.add_argument(
        "--lane",
        action="append",
        default=[],
        choices=(*lanes(Path()), "bench"),
        help="run only this lane (repeat for several); every lane by default",
    )
    parser.add_argument(
        "--lane-timeout",
        type=float,
        default=1500.0,
        metavar="SECONDS",
        help="stop a lane (or the bench) that runs longer, and report it as failed with "
        "its output (default 1500)",
    )
    options = parser.parse_args(argv)
    if options.prepare:
        manifest = prepare(options.wheels, options.python_version)
        wheels = manifest["wheels"]
        assert isinstance(wheels, dict)
        print(f"gpu-check: {len(wheels)} wheels, {int(str(manifest['bytes'])) / 2**20:.1f} MiB, "
              f"in {options.wheels}")  # fmt: skip
        return 0
    if options.lane_timeout <= 0:
        parser.error(
            f"--lane-timeout must be a positive number of seconds, not {options.lane_timeout:g}"
        )
    return check(options.wheels, options.site, options.report, options.lane, options.lane_timeout)


if __name__ == "__main__":
    sys.exit(main())
