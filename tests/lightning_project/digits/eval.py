"""Tests a trained checkpoint on the test set.

    python -m digits.eval ckpt_path=logs/train/runs/.../checkpoints/last.ckpt
    python -m digits.eval trainer=ddp ckpt_path=...

Run it from the project's folder; it writes into its own folder under ``logs/eval/``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import hydra

from digits.instantiate import instantiate_loggers, log_hyperparameters

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from plait.trainer import DataModule, Module, Trainer

log = logging.getLogger(__name__)


def evaluate(config: DictConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tests the checkpoint ``config.ckpt_path`` names.

    Returns:
        The test's metrics by name, and the objects made (``config``, ``datamodule``,
        ``model``, ``logger``, ``trainer``).

    Raises:
        ValueError: No checkpoint was named.
    """
    if not config.get("ckpt_path"):
        raise ValueError("name the checkpoint to test: ckpt_path=path/to/last.ckpt")
    datamodule: DataModule = hydra.utils.instantiate(config.data)
    model: Module = hydra.utils.instantiate(config.model)
    loggers = instantiate_loggers(config.get("logger"))
    trainer: Trainer = hydra.utils.instantiate(config.trainer, logger=loggers or False)
    objects: dict[str, Any] = {
        "config": config,
        "datamodule": datamodule,
        "model": model,
        "logger": loggers,
        "trainer": trainer,
    }
    log_hyperparameters(config, model, trainer)
    log.info("testing %s", config.ckpt_path)
    trainer.test(model=model, datamodule=datamodule, ckpt_path=config.ckpt_path)
    return dict(trainer.callback_metrics), objects


@hydra.main(version_base="1.3", config_path="../configs", config_name="eval.yaml")
def main(config: DictConfig) -> None:
    """Hydra's entry point."""
    evaluate(config)


if __name__ == "__main__":
    main()
