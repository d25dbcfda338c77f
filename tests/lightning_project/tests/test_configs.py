"""Every config composes, and makes what it names."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import hydra
import pytest
from digits.data import DigitsDataModule
from digits.instantiate import instantiate_callbacks, instantiate_loggers
from digits.models import DigitsModule
from hydra import compose, initialize
from hydra.core.hydra_config import HydraConfig

from plait.trainer import Trainer

if TYPE_CHECKING:
    from omegaconf import DictConfig


def test_train_config(train_config: DictConfig) -> None:
    assert train_config.data
    assert train_config.model
    assert train_config.trainer
    HydraConfig().set_config(train_config)
    assert isinstance(hydra.utils.instantiate(train_config.data), DigitsDataModule)
    with pytest.warns(UserWarning, match="not plain data"):
        assert isinstance(hydra.utils.instantiate(train_config.model), DigitsModule)
    assert isinstance(hydra.utils.instantiate(train_config.trainer), Trainer)


def test_eval_config(eval_config: DictConfig) -> None:
    assert eval_config.data
    assert eval_config.model
    assert eval_config.trainer
    HydraConfig().set_config(eval_config)
    assert isinstance(hydra.utils.instantiate(eval_config.data), DigitsDataModule)
    assert isinstance(hydra.utils.instantiate(eval_config.trainer), Trainer)


@pytest.mark.parametrize(
    ("overrides", "strategy", "devices"),
    [
        (["trainer=cpu"], "SingleDeviceStrategy", 1),
        (["trainer=ddp"], "DDPStrategy(popen)", 2),
        (["trainer=ddp_sim"], "DDPStrategy(spawn)", 2),
        (["experiment=small", "logger=many_loggers"], "SingleDeviceStrategy", 1),
        (["debug=fdr"], "SingleDeviceStrategy", 1),
    ],
)
def test_every_trainer_experiment_and_logger_config_makes_its_parts(
    overrides: list[str], strategy: str, devices: int, tmp_path: Path
) -> None:
    folders = [f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}"]
    with initialize(version_base="1.3", config_path="../configs"):
        config = compose("train.yaml", return_hydra_config=True, overrides=overrides + folders)
    HydraConfig().set_config(config)
    trainer = hydra.utils.instantiate(
        config.trainer,
        callbacks=instantiate_callbacks(config.callbacks),
        logger=instantiate_loggers(config.logger),
    )
    assert isinstance(trainer, Trainer)
    start_method = getattr(trainer.strategy, "start_method", None)
    made = type(trainer.strategy).__name__ + (f"({start_method})" if start_method else "")
    assert made == strategy
    assert trainer.num_devices == devices
    made_callbacks = {type(callback).__name__ for callback in trainer.callbacks}
    assert {"ModelCheckpoint", "EarlyStopping", "RichModelSummary"} <= made_callbacks
    names = sorted(type(logger).__name__ for logger in trainer.loggers)
    if "debug=fdr" in overrides:
        assert names == []  # a fast dev run logs nothing
    elif "logger=many_loggers" in overrides:
        assert names == ["CSVLogger", "TensorBoardLogger"]
    else:
        assert names == ["CSVLogger"]
