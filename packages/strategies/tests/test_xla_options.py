"""The XLA strategies where torch_xla is not installed: clear errors, nothing imported."""

from __future__ import annotations

import functools
from typing import NamedTuple

import pytest
import torch

from plait.checkpoint_io import TorchCheckpointIO, XLACheckpointIO
from plait.checkpoint_io.xla_io import to_cpu
from plait.core import CheckpointIORegistry, ConfigurationError, StrategyRegistry
from plait.strategies.xla import SingleDeviceXLAStrategy, XLAFSDPStrategy, XLAStrategy, library

needs_no_torch_xla = pytest.mark.skipif(
    library.is_available(), reason="checks the errors of a machine without torch_xla"
)


@needs_no_torch_xla
@pytest.mark.parametrize(
    "make",
    [
        SingleDeviceXLAStrategy,
        XLAStrategy,
        XLAFSDPStrategy,
        *[
            functools.partial(StrategyRegistry.get, name)
            for name in ("single_xla", "xla", "xla_debug", "xla_fsdp")
        ],
    ],
)
def test_choosing_an_xla_strategy_without_torch_xla_names_the_extra(make: object) -> None:
    assert callable(make)
    with pytest.raises(ConfigurationError, match=r"torch_xla, which is not installed") as caught:
        make()
    assert "pip install 'plait-strategies[xla]'" in str(caught.value)
    assert "tools/xla-env" in str(caught.value)


def test_a_device_that_is_not_xla_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"not 'cpu'") as caught:
        library.require_xla_device(torch.device("cpu"))
    assert "single_device" in str(caught.value)


def test_the_xla_checkpoint_io_is_registered_and_writes_torch_files() -> None:
    io = CheckpointIORegistry.get("xla")
    assert isinstance(io, XLACheckpointIO)
    assert isinstance(io, TorchCheckpointIO)


class Pair(NamedTuple):
    a: torch.Tensor
    b: float


def test_to_cpu_keeps_the_structure_and_leaves_cpu_tensors_alone() -> None:
    tensor = torch.ones(2)
    state = {"x": tensor, "l": [tensor, 3, "s"], "t": (tensor, None), "p": Pair(tensor, 1.5)}
    copied = to_cpu(state)
    assert isinstance(copied, dict)
    assert copied["x"] is tensor
    assert copied["l"] == [tensor, 3, "s"]
    assert isinstance(copied["t"], tuple)
    assert copied["t"][1] is None
    assert isinstance(copied["p"], Pair)
    assert copied["p"].b == 1.5


def test_to_cpu_copies_a_tensor_from_another_device() -> None:
    # The meta device stands in for an XLA one: the copy must leave it, or fail
    # loudly (meta tensors have no values), never pickle the device tensor.
    with pytest.raises(NotImplementedError):
        to_cpu({"w": torch.empty(2, device="meta")})


def test_every_xla_name_is_registered_with_a_description() -> None:
    for name in ("single_xla", "xla", "xla_debug", "xla_fsdp"):
        entry = StrategyRegistry.entry(name)
        assert entry.description
    assert StrategyRegistry.entry("xla_debug").init_params == {"debug": True}
