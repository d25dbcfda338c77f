"""tools/gpu-check, on a machine without a GPU: it prepares, runs every lane, skips saying why.

On a machine with a GPU the same command runs the lanes for real; that is its use,
not a test of it.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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

    # A lane that runs over its time is stopped and reported failed, with its output;
    # pytest cannot import torch in a fifth of a second, so this one always does.
    over = tmp_path / "over" / "r.json"
    run = _tool("--wheels", wheels, "--site", site, "--report", over,
                "--lane", "cuda-tests", "--lane-timeout", "0.2")  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    [lane] = json.loads(over.read_text())["lanes"]
    assert lane["errors"] == 1
    assert lane["failures"] == ["the lane ran over its 0.2 s (--lane-timeout) and was stopped"]
    assert "FAILED the lane ran over its 0.2 s" in over.with_suffix(".md").read_text()


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
