"""A checkpoint the training wrote, tested again: the same accuracy as the training's test."""

from __future__ import annotations

from pathlib import Path

import pytest
from digits.eval import evaluate
from digits.train import train
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

pytestmark = pytest.mark.filterwarnings("ignore:the hyperparameter.*not plain data")


@pytest.mark.slow
def test_train_eval(tmp_path: Path, train_config: DictConfig, eval_config: DictConfig) -> None:
    assert str(train_config.paths.output_dir) == str(tmp_path)
    HydraConfig().set_config(train_config)
    with open_dict(train_config):
        train_config.trainer.max_epochs = 1
        train_config.test = True
    trained, _ = train(train_config)
    assert "last.ckpt" in [path.name for path in (tmp_path / "checkpoints").iterdir()]

    with open_dict(eval_config):
        eval_config.ckpt_path = str(tmp_path / "checkpoints" / "last.ckpt")
    HydraConfig().set_config(eval_config)
    tested, _ = evaluate(eval_config)
    assert tested["test/acc"].item() > 0.0
    assert abs(trained["test/acc"].item() - tested["test/acc"].item()) < 0.001


def test_eval_without_a_checkpoint_says_which_to_name(eval_config: DictConfig) -> None:
    with open_dict(eval_config):
        eval_config.ckpt_path = None
    with pytest.raises(ValueError, match="ckpt_path="):
        evaluate(eval_config)
