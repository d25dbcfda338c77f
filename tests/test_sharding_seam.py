"""A sharding strategy written against plait's seams trains, evaluates and resumes exactly.

The strategy (FSDP2, in ``sharding_job.py``) is what a third party writes; these
tests prove the seams are enough: the Trainer calls the strategy for every step and
every state, evaluation keeps the ranks' collective forwards in step on data they
hold unevenly, and a checkpoint of the gathered shards resumes to the same losses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests import warm
from tests.processes import processes_mentioning

JOB = Path(__file__).resolve().with_name("sharding_job.py")

pytestmark = pytest.mark.slow


def _train(root: Path, epochs: int, *options: str) -> dict[str, object]:
    root.mkdir(exist_ok=True)
    done = warm.run(JOB, [str(root), str(epochs), *options], timeout=240)
    assert not processes_mentioning(str(root)), "a rank was left running"
    assert done.returncode == 0, done.stderr[-6000:]
    result: dict[str, object] = json.loads((root / f"result-{epochs}.json").read_text())
    return result


def test_a_sharded_run_resumed_from_its_checkpoint_goes_on_as_if_never_stopped(
    tmp_path: Path,
) -> None:
    straight = _train(tmp_path / "straight", 3)
    _train(tmp_path / "resumed", 2)
    resumed = _train(tmp_path / "resumed", 3, "--resume")

    losses = resumed["losses"]
    assert isinstance(losses, dict)
    assert sorted(losses, key=int) == ["8", "9", "10", "11"]  # the third epoch only
    assert straight["losses"] == {**straight["losses"], **losses}  # type: ignore[dict-item]
    # Validation ran through the sharded module on every rank, each sample once.
    assert resumed["val_seen"] == 9


def test_the_strategy_derives_its_mixed_precision_policy_from_the_plugin(
    tmp_path: Path,
) -> None:
    result = _train(tmp_path, 1, "bf16-mixed")

    assert result["param_dtype"] == "torch.bfloat16"
    assert result["reduce_dtype"] == "torch.float32"
