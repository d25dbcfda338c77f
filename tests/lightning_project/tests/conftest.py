"""The configs the tests run with: the project's own, made small and quiet, in a folder per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, open_dict

ROOT = Path(__file__).resolve().parents[1]


def _composed(config_name: str, overrides: list[str]) -> DictConfig:
    with initialize(version_base="1.3", config_path="../configs"):
        config = compose(
            config_name=config_name,
            return_hydra_config=True,
            overrides=[f"paths.root_dir={ROOT}", *overrides],
        )
    with open_dict(config):
        config.trainer.max_epochs = 1
        config.trainer.limit_train_batches = 0.5
        config.trainer.limit_val_batches = 0.5
        config.trainer.accelerator = "cpu"
        config.trainer.devices = 1
        config.trainer.enable_progress_bar = False
        config.data.num_workers = 0
        config.data.pin_memory = False
        config.logger = None
        # Quiet: no live progress bar or summary table in the tests' output.
        for name in ("rich_progress_bar", "model_summary"):
            if config.get("callbacks") and name in config.callbacks:
                del config.callbacks[name]
    return config


def _in(config: DictConfig, folder: Path) -> DictConfig:
    config = config.copy()
    with open_dict(config):
        config.paths.output_dir = str(folder)
        config.paths.log_dir = str(folder)
    return config


@pytest.fixture(scope="package")
def train_config_global() -> DictConfig:
    """The training config, composed once."""
    return _composed("train.yaml", [])


@pytest.fixture(scope="package")
def eval_config_global() -> DictConfig:
    """The evaluation config, composed once (its checkpoint named by each test)."""
    return _composed("eval.yaml", ["ckpt_path=."])


@pytest.fixture
def train_config(train_config_global: DictConfig, tmp_path: Path) -> Iterator[DictConfig]:
    """The training config, writing into this test's folder."""
    yield _in(train_config_global, tmp_path)
    GlobalHydra.instance().clear()


@pytest.fixture
def eval_config(eval_config_global: DictConfig, tmp_path: Path) -> Iterator[DictConfig]:
    """The evaluation config, writing into this test's folder."""
    yield _in(eval_config_global, tmp_path)
    GlobalHydra.instance().clear()
