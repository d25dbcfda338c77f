"""Trains the classifier the config describes, then tests the best checkpoint.

    python -m digits.train                                  # on the CPU, one process
    python -m digits.train trainer=ddp                      # two processes
    python -m digits.train -m model.optimizer.lr=0.01,0.003 # a sweep, one run per value
    python -m digits.train experiment=small                 # an experiment's settings

Run it from the project's folder. Each run writes into its own folder under
``logs/train/``: the config, the log, the checkpoints and the loggers' files.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import hydra
import torch

from digits.instantiate import (
    instantiate_callbacks,
    instantiate_loggers,
    log_hyperparameters,
    metric_value,
)

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from plait.trainer import DataModule, Module, Trainer

log = logging.getLogger(__name__)


def train(config: DictConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fits the model on the data, then tests it; Hydra's config says how.

    Returns:
        The metrics of the run (the fit's, then the test's, by name), and the objects
        made (``config``, ``datamodule``, ``model``, ``callbacks``, ``logger``,
        ``trainer``).
    """
    if config.get("seed") is not None:
        torch.manual_seed(int(config.seed))

    log.info("making the datamodule <%s>", config.data._target_)
    datamodule: DataModule = hydra.utils.instantiate(config.data)
    log.info("making the model <%s>", config.model._target_)
    model: Module = hydra.utils.instantiate(config.model)
    callbacks = instantiate_callbacks(config.get("callbacks"))
    loggers = instantiate_loggers(config.get("logger"))
    log.info("making the trainer <%s>", config.trainer._target_)
    trainer: Trainer = hydra.utils.instantiate(
        config.trainer, callbacks=callbacks, logger=loggers or False
    )
    objects: dict[str, Any] = {
        "config": config,
        "datamodule": datamodule,
        "model": model,
        "callbacks": callbacks,
        "logger": loggers,
        "trainer": trainer,
    }
    log_hyperparameters(config, model, trainer)

    if config.get("train"):
        log.info("training")
        trainer.fit(model=model, datamodule=datamodule, ckpt_path=config.get("ckpt_path"))
    train_metrics = dict(trainer.callback_metrics)

    if config.get("test"):
        log.info("testing")
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if not best:
            log.warning("no best checkpoint: testing the weights the fit ended with")
        trainer.test(model=model, datamodule=datamodule, ckpt_path=best or None)
        log.info("best checkpoint: %s", best)
    test_metrics = dict(trainer.callback_metrics)

    return {**train_metrics, **test_metrics}, objects


@hydra.main(version_base="1.3", config_path="../configs", config_name="train.yaml")
def main(config: DictConfig) -> float | None:
    """Hydra's entry point: trains, and gives a sweeper the metric it optimises."""
    metrics, _ = train(config)
    return metric_value(metrics, config.get("optimized_metric"))


if __name__ == "__main__":
    main()
