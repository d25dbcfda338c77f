"""What Lightning code reads of a strategy and a precision plugin, beside the loops."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from plait.core import CheckpointError
from plait.precision import MixedPrecision, TruePrecision
from plait.strategies import DDPStrategy, SingleDeviceStrategy


def test_tensors_made_in_the_init_context_are_on_the_device_in_the_precisions_dtype() -> None:
    strategy = SingleDeviceStrategy("cpu", precision="bf16-true")

    with strategy.tensor_init_context():
        inside = torch.ones(2)
    with strategy.module_init_context():
        layer = nn.Linear(2, 2)

    assert (inside.dtype, inside.device) == (torch.bfloat16, torch.device("cpu"))
    assert layer.weight.dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32  # restored
    assert torch.ones(1).dtype == torch.float32


def test_precision_plugins_set_the_default_dtype_for_true_formats_only() -> None:
    with TruePrecision("64-true").module_init_context():
        assert nn.Linear(1, 1).weight.dtype == torch.float64
    with MixedPrecision("bf16-mixed").tensor_init_context():
        assert torch.ones(1).dtype == torch.float32  # autocast casts per operation
    assert torch.get_default_dtype() == torch.float32


def test_empty_init_leaves_the_initialisation_torchs_layers_run_out() -> None:
    strategy = SingleDeviceStrategy("cpu")
    weight = torch.zeros(3, 2)

    with strategy.tensor_init_context(empty_init=True):
        torch.nn.init.kaiming_uniform_(weight)  # what nn.Linear runs
        torch.nn.init.uniform_(weight)
        torch.nn.init.normal_(tensor=weight)
    assert torch.equal(weight, torch.zeros(3, 2))
    with strategy.tensor_init_context():
        torch.nn.init.uniform_(weight, 1.0, 2.0)
    assert bool((weight >= 1.0).all())


def test_a_strategy_says_its_devices_nodes_and_local_rank() -> None:
    single = SingleDeviceStrategy("cpu")
    ddp = DDPStrategy(accelerator="cpu", parallel_devices=[torch.device("cpu")] * 2)

    assert (single.local_rank, single.num_nodes) == (0, 1)
    assert ddp.parallel_devices == [torch.device("cpu")] * 2
    assert (ddp.local_rank, ddp.num_nodes) == (0, 1)
    assert DDPStrategy(accelerator="cpu").parallel_devices == [torch.device("cpu")]


def test_load_module_state_dict_is_strict_unless_asked_not_to_be() -> None:
    strategy = SingleDeviceStrategy("cpu")
    first, second = nn.Linear(2, 2), nn.Linear(2, 1)
    module = strategy.setup_module(nn.Sequential(first, second))
    source = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))

    strategy.load_module_state_dict(module, source.state_dict())
    assert torch.equal(first.weight, source.state_dict()["0.weight"])

    partial = {"0.weight": torch.full((2, 2), 7.0), "extra.weight": torch.ones(1)}
    with pytest.raises(CheckpointError, match=r"extra\.weight"):
        strategy.load_module_state_dict(module, partial)
    before = second.weight.detach().clone()
    strategy.load_module_state_dict(module, partial, strict=False)
    assert torch.equal(first.weight, torch.full((2, 2), 7.0))
    assert torch.equal(second.weight, before)  # what the state lacks is left alone


@pytest.mark.parametrize("checkpoint_io", ["torch", "distributed"])
def test_load_checkpoint_not_strict_takes_what_fits_and_leaves_the_rest(
    tmp_path: Path, checkpoint_io: str
) -> None:
    strategy = SingleDeviceStrategy("cpu", checkpoint_io=checkpoint_io)
    saved = nn.Sequential(nn.Linear(2, 2))
    path = tmp_path / "checkpoint"
    strategy.save_checkpoint({"model": strategy.setup_module(saved), "step": 3}, path)

    # A module with a layer more, and a state entry the checkpoint never had.
    kept, added = nn.Linear(2, 2), nn.Linear(2, 1)
    head = added.weight.detach().clone()
    model = strategy.setup_module(nn.Sequential(kept, added))
    state: dict[str, object] = {"model": model, "step": 0, "epoch": 9}
    with pytest.raises(CheckpointError):  # strict: the layer, or the entry, is named
        strategy.load_checkpoint(path, state)

    strategy.load_checkpoint(path, state, strict=False)

    assert torch.equal(kept.weight, saved.state_dict()["0.weight"])
    assert torch.equal(added.weight, head)
    assert (state["step"], state["epoch"]) == (3, 9)
