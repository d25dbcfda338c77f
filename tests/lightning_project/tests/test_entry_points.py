"""The entry points as a user types them: train, then eval, on two processes (``trainer=ddp``)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from digits.eval import evaluate
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["callbacks.rich_progress_bar=null", "callbacks.model_summary=null"]


def _run(module: str, *overrides: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def _logged(folder: Path) -> dict[str, float]:
    """The last value of each metric in the run's ``metrics.csv``."""
    values: dict[str, float] = {}
    with open(folder / "csv" / "version_0" / "metrics.csv", newline="") as file:
        for row in csv.DictReader(file):
            values.update({name: float(value) for name, value in row.items() if value})
    return values


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:the hyperparameter.*not plain data")
def test_train_then_eval_on_ddp(tmp_path: Path, eval_config: DictConfig) -> None:
    trained = tmp_path / "train"
    _run("digits.train", "trainer=ddp", "trainer.max_epochs=2", f"hydra.run.dir={trained}", *QUIET)
    # One run: one folder, one logger version, rank 0's configuration.
    assert sorted(path.name for path in trained.iterdir()) == [
        ".hydra",
        "checkpoints",
        "csv",
        "train.log",
    ]
    assert sorted(path.name for path in (trained / "csv").iterdir()) == ["version_0"]
    [best] = (trained / "checkpoints").glob("epoch_*.ckpt")
    training = _logged(trained)
    assert training["step"] == 2 * 11  # 700 samples, 32 a process a step, two epochs
    assert training["val/acc"] > 0.5

    evaluated = tmp_path / "eval"
    _run("digits.eval", "trainer=ddp", f"ckpt_path={best}", f"hydra.run.dir={evaluated}")
    # The checkpoint the training tested gives the same accuracy: every sample counted once.
    assert _logged(evaluated)["test/acc"] == training["test/acc"]

    # And in one process.
    with open_dict(eval_config):
        eval_config.ckpt_path = str(best)
    HydraConfig().set_config(eval_config)
    tested, _ = evaluate(eval_config)
    assert tested["test/acc"].item() == pytest.approx(training["test/acc"], abs=1e-7)
