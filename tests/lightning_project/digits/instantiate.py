"""What the configs describe, made: callbacks and loggers from their groups, and the run's log."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import hydra
from omegaconf import DictConfig, OmegaConf

from plait.trainer import Callback, Logger, Module, Trainer

log = logging.getLogger(__name__)


def _made(group: DictConfig | None, kind: type[object], what: str) -> list[object]:
    made: list[object] = []
    if not group:
        log.warning("no %s configured", what)
        return made
    if not isinstance(group, DictConfig):
        raise TypeError(f"the {what} config must be a mapping of names to configs")
    for key, entry in group.items():
        name = str(key)
        if isinstance(entry, DictConfig) and "_target_" in entry:
            log.info("making %s %s <%s>", what, name, entry._target_)
            thing = hydra.utils.instantiate(entry)
            if not isinstance(thing, kind):
                raise TypeError(f"{what} {name} made a {type(thing).__name__}")
            made.append(thing)
    return made


def instantiate_callbacks(config: DictConfig | None) -> list[Callback]:
    """The callbacks of the ``callbacks`` group, in the order they are listed."""
    return [c for c in _made(config, Callback, "callback") if isinstance(c, Callback)]


def instantiate_loggers(config: DictConfig | None) -> list[Logger]:
    """The loggers of the ``logger`` group."""
    return [c for c in _made(config, Logger, "logger") if isinstance(c, Logger)]


def log_hyperparameters(config: DictConfig, model: Module, trainer: Trainer) -> None:
    """Sends the run's configuration, and the model's size, to every logger."""
    if not trainer.loggers:
        log.warning("no logger: the hyperparameters are not recorded")
        return

    def resolved(name: str) -> object:
        section = config.get(name)
        if isinstance(section, DictConfig):
            return OmegaConf.to_container(section, resolve=True)
        return section

    hyperparameters: dict[str, object] = {
        "model": resolved("model"),
        "data": resolved("data"),
        "trainer": resolved("trainer"),
        "seed": resolved("seed"),
        "ckpt_path": resolved("ckpt_path"),
        "model/params/total": sum(p.numel() for p in model.parameters()),
        "model/params/trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    for logger in trainer.loggers:
        logger.log_hyperparams(hyperparameters)


def metric_value(metrics: Mapping[str, object], name: str | None) -> float | None:
    """The value of ``name`` among the run's metrics (what a sweep optimises), or ``None``.

    Raises:
        KeyError: No metric has that name; the names there are listed.
    """
    if not name:
        return None
    if name not in metrics:
        raise KeyError(
            f"no metric {name!r} to optimise: the run logged {', '.join(sorted(metrics))}"
        )
    value = metrics[name]
    item = getattr(value, "item", None)
    if not callable(item):
        raise TypeError(f"metric {name!r} is a {type(value).__name__}, not a number")
    number = item()
    assert isinstance(number, float | int)
    return float(number)
