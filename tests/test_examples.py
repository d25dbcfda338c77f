"""The examples run as written."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_standalone_ddp_example_trains_on_two_processes(tmp_path: Path) -> None:
    checkpoint = tmp_path / "last.pt"
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "ddp_standalone.py"),
         "--processes", "2", "--epochs", "4", "--checkpoint", str(checkpoint)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+) \(mean over 2 ranks\)", result.stdout)]
    assert len(losses) == 4
    assert losses[-1] < losses[0] / 2
    assert "final loss" in result.stdout
    state = torch.load(checkpoint, weights_only=True)
    assert state["epochs"] == 4
    assert set(state["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
