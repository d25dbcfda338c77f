"""The process-group strategies take one set of shared options, alike, and pass each on."""

from __future__ import annotations

import inspect
from datetime import timedelta

import pytest
import torch

from plait.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    ParallelStrategy,
)
from plait.strategies.parallel import PROCESS_GROUP_OPTIONS, process_group_options

FAMILIES = (DDPStrategy, FSDPStrategy, ModelParallelStrategy, DeepSpeedStrategy)


def test_the_set_is_the_base_strategys_keywords_in_its_order() -> None:
    base = inspect.signature(ParallelStrategy).parameters
    assert tuple(base) == PROCESS_GROUP_OPTIONS


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.__name__)
def test_each_family_declares_every_option_as_the_base_does(family: type[ParallelStrategy]) -> None:
    base = inspect.signature(ParallelStrategy).parameters
    own = inspect.signature(family).parameters
    for name in PROCESS_GROUP_OPTIONS:
        assert name in own, f"{family.__name__} does not take {name}="
        assert own[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert own[name].default == base[name].default, name
        assert own[name].annotation == base[name].annotation, name


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.__name__)
def test_each_family_passes_every_option_on(family: type[ParallelStrategy]) -> None:
    strategy = family(
        accelerator="cpu",
        parallel_devices=[torch.device("cpu")],
        cluster_environment="local",
        precision_plugin="bf16-mixed",
        process_group_backend="gloo",
        timeout=timedelta(seconds=7),
        start_timeout=timedelta(seconds=11),
        checked_collectives=False,
    )
    assert strategy.accelerator.name == "cpu"
    assert strategy.parallel_devices == [torch.device("cpu")]
    assert type(strategy.cluster_environment).__name__ == "LocalEnvironment"
    assert "bf16-mixed" in repr(strategy.precision)
    assert strategy.process_group_backend == "gloo"
    assert strategy.timeout == timedelta(seconds=7)
    assert strategy.start_timeout == timedelta(seconds=11)
    assert strategy.checked_collectives is False


def test_the_options_are_picked_from_a_strategys_arguments_overrides_over_them() -> None:
    given = {"self": object(), "timeout": timedelta(seconds=3), "stage": 2, "checkpoint_io": None}
    assert process_group_options(given, checkpoint_io="distributed") == {
        "checkpoint_io": "distributed",
        "timeout": timedelta(seconds=3),
    }
