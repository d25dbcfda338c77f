"""Training: a quick check, two processes, validation twice an epoch, and a resumed run."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
from digits.train import train
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

pytestmark = pytest.mark.filterwarnings("ignore:the hyperparameter.*not plain data")


def test_train_fast_dev_run(train_config: DictConfig) -> None:
    HydraConfig().set_config(train_config)
    with open_dict(train_config):
        train_config.trainer.fast_dev_run = True
    metrics, objects = train(train_config)
    assert objects["trainer"].global_step == 1
    assert {"train/loss", "val/acc", "test/acc"} <= set(metrics)


@pytest.mark.slow
def test_train_ddp_sim(train_config: DictConfig, tmp_path: Path) -> None:
    # Two CPU processes spawned from this one (trainer=ddp_sim).
    HydraConfig().set_config(train_config)
    with open_dict(train_config):
        train_config.trainer.max_epochs = 2
        train_config.trainer.devices = 2
        train_config.trainer.strategy = "ddp_spawn"
        train_config.test = False  # a test on two processes: test_entry_points.py
    metrics, objects = train(train_config)
    assert objects["trainer"].current_epoch == 2
    assert 0.5 < metrics["val/acc"].item() <= 1.0
    files = sorted(os.listdir(tmp_path / "checkpoints"))
    assert "last.ckpt" in files
    assert len(files) == 2


def test_train_epoch_double_val_loop(train_config: DictConfig, tmp_path: Path) -> None:
    HydraConfig().set_config(train_config)
    with open_dict(train_config):
        train_config.trainer.max_epochs = 1
        train_config.trainer.limit_train_batches = 4
        train_config.trainer.val_check_interval = 0.5
        train_config.logger = {
            "csv": {"_target_": "plait.trainer.CSVLogger", "save_dir": str(tmp_path)}
        }
    metrics, objects = train(train_config)
    assert objects["trainer"].current_epoch == 1
    assert {"val/acc", "val/acc_best", "test/acc"} <= set(metrics)
    with open(tmp_path / "plait_logs" / "version_0" / "metrics.csv", newline="") as file:
        validations = [row for row in csv.DictReader(file) if row["val/acc"]]
    # Halfway through the epoch, and at its end.
    assert [int(row["step"]) for row in validations] == [2, 4]


@pytest.mark.slow
def test_train_resume(train_config: DictConfig, tmp_path: Path) -> None:
    HydraConfig().set_config(train_config)
    with open_dict(train_config):
        train_config.trainer.max_epochs = 1
        train_config.trainer.limit_train_batches = 1.0
        train_config.trainer.limit_val_batches = 1.0
    first, _ = train(train_config)
    files = os.listdir(tmp_path / "checkpoints")
    assert "last.ckpt" in files
    assert "epoch_000.ckpt" in files

    with open_dict(train_config):
        train_config.ckpt_path = str(tmp_path / "checkpoints" / "last.ckpt")
        train_config.trainer.max_epochs = 2
    second, objects = train(train_config)
    files = os.listdir(tmp_path / "checkpoints")
    assert "epoch_001.ckpt" in files
    assert "epoch_002.ckpt" not in files
    assert objects["trainer"].current_epoch == 2
    assert first["train/acc"].item() < second["train/acc"].item()
    assert first["val/acc"].item() < second["val/acc"].item()

    # And on: a third epoch from the resumed run's own checkpoint.
    with open_dict(train_config):
        train_config.trainer.max_epochs = 3
    third, _ = train(train_config)
    assert "epoch_002.ckpt" in os.listdir(tmp_path / "checkpoints")
    assert second["val/acc_best"].item() <= third["val/acc_best"].item()
