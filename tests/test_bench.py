"""tools/bench.py runs, prints its table and writes one JSON row per measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TOOLS = Path(__file__).resolve().parent.parent / "tools"
TOOL = TOOLS / "bench.py"
TRAINING = TOOLS / "bench_training.py"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.slow
def test_the_conformance_section_reports_a_rate_per_property(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"

    run = _bench("--quick", "--sections", "conformance", "--json", str(out))

    assert run.returncode == 0, run.stderr
    assert "== conformance" in run.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {row["name"] for row in rows} >= {"broadcast, world size 2", "mismatch, world size 2"}
    assert all(row["median"] > 0 and row["ratio"] is None for row in rows)


def test_an_unknown_section_is_refused_with_the_choices() -> None:
    run = _bench("--sections", "imports,speed")

    assert run.returncode == 2
    choices = (
        "imports, cli, steps, ddp, fsdp, deepspeed, model_parallel, context_parallel, "
        "pipeline, collectives, scale, checkpoints, conformance"
    )
    assert f"unknown sections ['speed']: choose from {choices}" in run.stderr


SIDES = (
    "plain",
    "plait-strategy",
    "plait-trainer",
    "plait-trainer-log",
    "plait-trainer-manual-memory",
)


def test_the_steps_workload_times_every_side_it_is_given() -> None:
    run = subprocess.run(
        [sys.executable, str(TRAINING), "steps", "--width", "8", "--steps", "5", "--rounds", "2",
         "--sides", ",".join(SIDES)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert run.returncode == 0, run.stderr
    times = json.loads(run.stdout.splitlines()[-1])
    assert set(times) == set(SIDES)
    assert all(len(per_round) == 2 and min(per_round) > 0 for per_round in times.values())


def test_an_unknown_side_is_refused_with_the_choices() -> None:
    run = subprocess.run(
        [sys.executable, str(TRAINING), "steps", "--sides", "plain,keras"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert run.returncode == 2
    assert "unknown sides ['keras']: choose from plain, plait-strategy" in run.stderr


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="this machine has a CUDA device")
def test_the_gpu_rows_without_a_gpu_are_refused_with_the_fix() -> None:
    run = _bench("--accelerator", "cuda", "--sections", "fsdp")

    assert run.returncode == 2
    assert "--accelerator cuda: this machine has no CUDA device; use --accelerator cpu" in (
        run.stderr
    )
    sharding = subprocess.run(
        [sys.executable, str(TOOLS / "bench_fsdp.py"), "--side", "plain-ddp",
         "--accelerator", "cuda", "--ranks", "2", "--out", "unused.json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert sharding.returncode == 2
    assert "--ranks 2 needs as many GPUs: this machine has 0; pass --ranks 1" in sharding.stderr


def test_the_model_parallel_sides_refuse_other_than_four_gloo_ranks() -> None:
    run = subprocess.run(
        [sys.executable, str(TOOLS / "bench_fsdp.py"), "--side", "mesh-2x2",
         "--ranks", "2", "--out", "unused.json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert run.returncode == 2
    assert "--side mesh-2x2 runs on 4 gloo ranks: pass --ranks 4" in run.stderr
