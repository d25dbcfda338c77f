"""The examples run as written: train, resume where they stopped, export one plain file.

The ranks start by ``fork`` here, which spares each the imports ``spawn`` repeats;
``spawn``, the examples' default, is every ``ddp_spawn`` test's.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
COMMAND_TIMEOUT = 240

# pytest's own bound (120 s) is for a test in one process. A test here is bounded by its
# commands' timeouts, and pytest's bound is two commands', so that a command that runs
# long is stopped and reported with its output.
pytestmark = pytest.mark.timeout(2 * COMMAND_TIMEOUT)


def _run(example: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / example), "--processes", "2",
         "--start-method", "fork", *arguments],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _losses(output: str) -> dict[int, float]:
    found = re.findall(r"epoch (\d+): loss (\d+\.\d+) \(mean over 2 ranks\)", output)
    return {int(epoch): float(loss) for epoch, loss in found}


@pytest.mark.slow
def test_the_standalone_ddp_example_trains_resumes_and_exports(tmp_path: Path) -> None:
    first = _run("ddp_standalone.py", "--epochs", "4", "--checkpoint", str(tmp_path))
    resumed = _run("ddp_standalone.py", "--epochs", "6", "--checkpoint", str(tmp_path), "--resume")

    losses = _losses(first.stdout)
    assert sorted(losses) == [0, 1, 2, 3]
    assert losses[3] < losses[0] / 2
    assert sorted(_losses(resumed.stdout)) == [4, 5]  # it went on where it stopped
    assert "final loss" in resumed.stdout
    last = torch.load(tmp_path / "last", weights_only=True)
    assert last["epoch"] == 6
    assert last["loader"] == {"epoch": 6}  # the sampler's epoch came back with it
    plain = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    plain.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True)["state_dict"])


@pytest.mark.slow
def test_the_standalone_fsdp_example_trains_sharded_and_exports_one_file(tmp_path: Path) -> None:
    result = _run("fsdp_standalone.py", "--epochs", "3", "--checkpoint", str(tmp_path))

    losses = _losses(result.stdout)
    assert sorted(losses) == [0, 1, 2]
    assert losses[2] < losses[0] / 2
    assert (tmp_path / "last" / ".metadata").is_file()  # shards, each rank its own
    state = torch.load(tmp_path / "model.pt", weights_only=True)["state_dict"]
    assert {key: tuple(value.shape) for key, value in state.items()} == {
        "0.weight": (32, 8), "0.bias": (32,), "1.linear.weight": (32, 32),
        "1.linear.bias": (32,), "2.linear.weight": (32, 32), "2.linear.bias": (32,),
        "3.weight": (1, 32), "3.bias": (1,),
    }  # fmt: skip


@pytest.mark.slow
def test_the_local_sgd_example_trains_and_ends_with_one_module() -> None:
    result = _run("local_sgd.py", "--steps", "22")

    found = re.search(r"final loss (\d+\.\d+) on 2 processes", result.stdout)
    assert found is not None, result.stdout
    assert float(found.group(1)) < 0.5  # the line is learnt: the loss starts near 15
