"""tools/gpu-check, on a machine without a GPU: it prepares, runs every lane, skips saying why.

On a machine with a GPU the same command runs the lanes for real; that is its use,
not a test of it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from tests.processes import processes_mentioning

TOOL = Path(__file__).resolve().parent.parent / "tools" / "gpu_check.py"
LANES = ["cuda-tests", "conformance-nccl", "conformance-gloo-cuda"]


def _tool(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="here the lanes would run for real")
def test_without_a_gpu_every_lane_runs_its_tests_skip_saying_why_and_the_report_is_written(
    tmp_path: Path,
) -> None:
    wheels, site, report = tmp_path / "wheels", tmp_path / "site", tmp_path / "out" / "r.json"
    here = ".".join(platform.python_version_tuple()[:2])
    prepared = _tool("--prepare", "--wheels", wheels, "--python-version", here)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    manifest = json.loads((wheels / "manifest.json").read_text())
    names = {name.split("-")[0] for name in manifest["wheels"]}
    assert {"plait_core", "plait_strategies", "plait_trainer", "plait_conformance"} <= names
    assert {"deepspeed", "pytest", "hypothesis"} <= names
    assert "torch" not in names
    assert manifest["bytes"] < 64 * 2**20

    run = _tool("--wheels", wheels, "--site", site, "--report", report)

    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(report.read_text())
    assert result["machine"]["devices"] == []
    assert result["machine"]["cuda_available"] is False
    assert result["machine"]["plait_path"].startswith(str(site))  # from the wheels
    assert result["machine"]["torch"] == torch.__version__  # the machine's own
    assert [lane["name"] for lane in result["lanes"]] == LANES
    for lane in result["lanes"]:
        assert lane["passed"] == lane["failed"] == lane["errors"] == 0, lane
        assert lane["skipped"] > 0, lane
    reasons = {lane["name"]: " ".join(lane["skip_reasons"]) for lane in result["lanes"]}
    assert "needs a CUDA device: this machine has none" in reasons["cuda-tests"]
    assert "the nccl lane needs a CUDA device: this machine has 0" in reasons["conformance-nccl"]
    assert "the gloo-cuda lane needs a CUDA device" in reasons["conformance-gloo-cuda"]
    assert result["bench"] == {"rows": [], "skipped": "no CUDA device: the GPU rows need one"}
    text = report.with_suffix(".md").read_text()
    assert "| cuda-tests | 0 | 0 |" in text
    assert text in run.stdout


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_lane_that_runs_over_its_time_is_stopped_whole_and_reported_failed(
    tmp_path: Path,
) -> None:
    tool = _module()
    # pytest cannot import torch in a fifth of a second: this lane always runs over.
    lane = tool.Lane("slow", "a lane that runs over", ("-m", "cuda", "tests"), workers=2)

    result = tool.run_lane(lane, dict(os.environ), tmp_path, gpu=True, limit=0.2)

    assert result.errors == 1
    assert result.failures == ["the lane ran over its 0.2 s (--lane-timeout) and was stopped"]
    assert result.seconds < 60
    assert not processes_mentioning(str(tmp_path)), "a worker of the lane was left running"
    text = tool.render({
        "made": "now", "commit": "c", "python": "3", "machine":
        {"devices": [], "torch": "t", "cuda": None, "nccl": None},
        "lanes": [result.__dict__], "bench": {"rows": [], "skipped": "not chosen"},
    })  # fmt: skip
    assert "| slow | 0 | 1 | 0 |" in text
    assert "FAILED the lane ran over its 0.2 s" in text


def test_wheels_that_were_never_prepared_are_named_with_the_fix(tmp_path: Path) -> None:
    run = _tool("--wheels", tmp_path, "--site", tmp_path / "site", timeout=60)

    assert run.returncode == 1
    assert f"{tmp_path} holds no manifest.json: run `tools/gpu-check --prepare`" in run.stderr


def test_a_lane_timeout_that_is_not_a_positive_number_is_refused() -> None:
    run = _tool("--lane-timeout", "0", timeout=60)

    assert run.returncode == 2
    assert "--lane-timeout must be a positive number of seconds, not 0" in run.stderr


def test_an_unknown_lane_is_refused_with_the_choices() -> None:
    run = _tool("--lane", "tpu", timeout=60)

    assert run.returncode == 2
    assert "invalid choice: 'tpu'" in run.stderr
    assert "'conformance-gloo-cuda'" in run.stderr
