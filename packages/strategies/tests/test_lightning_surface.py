"""What Lightning code reads of a strategy and a precision plugin, beside the loops."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from typing_extensions import override

from plait.accelerators import CPUAccelerator
from plait.core import CheckpointError, ConfigurationError
from plait.precision import MixedPrecision, TruePrecision
from plait.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy


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


class _Renaming(nn.Module):
    """A module whose load_state_dict takes an older name of its layer, as projects write."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.stricts: list[bool] = []

    @override
    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        self.stricts.append(strict)
        renamed = {key.replace("old_layer.", "layer."): value for key, value in state_dict.items()}
        return super().load_state_dict(renamed, strict=strict, assign=assign)


def test_load_module_state_dict_not_strict_calls_the_modules_own_load_with_the_state_given() -> (
    None
):
    strategy = SingleDeviceStrategy("cpu")
    module = _Renaming()
    model = strategy.setup_module(module)
    weight = torch.full((2, 2), 3.0)

    strategy.load_module_state_dict(model, {"old_layer.weight": weight}, strict=False)

    assert module.stricts == [False]
    assert torch.equal(module.layer.weight, weight)
    with pytest.raises(CheckpointError, match=r"'layer\.weight' has shape \(3,\)"):
        strategy.load_module_state_dict(model, {"layer.weight": torch.ones(3)}, strict=False)


def test_save_checkpoint_takes_fabrics_order_too(tmp_path: Path) -> None:
    strategy = SingleDeviceStrategy("cpu")
    model = strategy.setup_module(nn.Linear(2, 2))

    strategy.save_checkpoint(tmp_path / "fabric", {"model": model, "step": 3})  # type: ignore[arg-type]
    strategy.save_checkpoint({"model": model, "step": 4}, str(tmp_path / "lightning"))

    assert torch.load(tmp_path / "fabric", weights_only=False)["step"] == 3
    assert torch.load(tmp_path / "lightning", weights_only=False)["step"] == 4
    with pytest.raises(ConfigurationError, match="a dict and a dict"):
        strategy.save_checkpoint({"step": 1}, {"step": 2})  # type: ignore[arg-type]


def test_what_torch_load_gives_of_a_saved_state(tmp_path: Path) -> None:
    # The layout a user's script reads: the module's state under 'state_dict', the
    # optimizers' in order under 'optimizer_states', the names they were given under
    # 'plait_names', and the state's other entries under their own names.
    strategy = SingleDeviceStrategy("cpu")
    model, [optimizer] = _set_up(strategy)
    strategy.save_checkpoint({"model": model, "optimizer": optimizer, "step": 7}, tmp_path / "c")

    read = torch.load(tmp_path / "c", weights_only=True)

    assert sorted(read) == ["optimizer_states", "plait_names", "precision", "state_dict", "step"]
    assert read["plait_names"] == {"module": "model", "optimizers": ["optimizer"]}
    nn.Linear(2, 2).load_state_dict(read["state_dict"])
    assert read["optimizer_states"][0]["param_groups"][0]["lr"] == 0.1
    assert read["step"] == 7


def _set_up(strategy: SingleDeviceStrategy) -> tuple[nn.Module, list[torch.optim.Optimizer]]:
    layer = nn.Linear(2, 2)
    return strategy.setup_module_and_optimizers(
        layer, [torch.optim.SGD(layer.parameters(), lr=0.1)]
    )


@pytest.mark.parametrize("strict", [True, False])
def test_a_modules_bare_state_dict_loads_into_the_module_alone(
    tmp_path: Path, strict: bool
) -> None:
    strategy = SingleDeviceStrategy("cpu")
    source = nn.Linear(2, 2)
    torch.save(source.state_dict(), tmp_path / "bare.pt")
    model = strategy.setup_module(nn.Linear(2, 2))

    left = strategy.load_checkpoint(tmp_path / "bare.pt", model, strict=strict)

    assert left == {}
    assert isinstance(model, nn.Linear)
    assert torch.equal(model.weight, source.weight)
    # Into a state with optimizers it is no checkpoint: the error says how it loads.
    model, [optimizer] = _set_up(strategy)
    with pytest.raises(CheckpointError, match=r"load_checkpoint\(path, model\)"):
        strategy.load_checkpoint(tmp_path / "bare.pt", {"model": model, "optimizer": optimizer})


def test_asking_for_an_optimizer_left_unread_says_how_to_restore_or_read_it(
    tmp_path: Path,
) -> None:
    strategy = SingleDeviceStrategy("cpu")
    model, [optimizer] = _set_up(strategy)
    strategy.save_checkpoint({"model": model, "optimizer": optimizer, "step": 2}, tmp_path / "c")

    left = strategy.load_checkpoint(tmp_path / "c", {"model": model})

    assert dict(left) == {"step": 2}
    assert "optimizer" not in left
    with pytest.raises(KeyError, match=r"leaves unread[\s\S]*'optimizer': optimizer"):
        left["optimizer"]
    with pytest.raises(CheckpointError, match="read_checkpoint"):
        left["optimizer"]
    with pytest.raises(KeyError, match=r"^'scheduler'$"):
        left["scheduler"]  # a name the checkpoint never held: a plain KeyError


def test_fabrics_optimizer_and_clipping_calls() -> None:
    strategy = SingleDeviceStrategy("cpu")
    layer = nn.Linear(2, 1, bias=False)
    model = strategy.setup_module(layer)
    optimizer = strategy.setup_optimizer(torch.optim.SGD(layer.parameters(), lr=0.1))
    assert isinstance(optimizer, torch.optim.SGD)

    def gradient(value: list[float]) -> None:
        layer.weight.grad = torch.tensor([value])

    gradient([3.0, 4.0])
    norm = strategy.clip_gradients_norm(model, optimizer, max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)  # before clipping, as torch gives it
    assert layer.weight.grad is not None
    assert torch.linalg.vector_norm(layer.weight.grad).item() == pytest.approx(1.0, rel=1e-5)

    gradient([3.0, -4.0])
    strategy.clip_gradients_value(model, optimizer, clip_val=2.0)
    assert layer.weight.grad.tolist() == [[2.0, -2.0]]

    for bad, match in [({"max_norm": 0.0}, "above 0"), ({"max_norm": 1.0, "norm_type": 1.0}, "2")]:
        with pytest.raises(ConfigurationError, match=match):
            strategy.clip_gradients_norm(model, optimizer, **bad)  # type: ignore[arg-type]
    gradient([float("inf"), 1.0])
    with pytest.raises(RuntimeError, match="inf or nan"):
        strategy.clip_gradients_norm(model, optimizer, max_norm=1.0)
    gradient([float("nan"), 1.0])
    assert strategy.clip_gradients_norm(model, optimizer, 1.0, error_if_nonfinite=False).isnan()


def test_clip_gradients_norm_gives_the_norm_unscaled_under_16_mixed() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    strategy = SingleDeviceStrategy("cpu", precision=MixedPrecision("16-mixed", scaler=scaler))
    layer = nn.Linear(2, 1, bias=False)
    model = strategy.setup_module(layer)
    optimizer = strategy.setup_optimizer(torch.optim.SGD(layer.parameters(), lr=0.1))
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.0, 0.0]]))
    output = strategy.training_step(model, torch.tensor([[3.0, 4.0]]))
    assert isinstance(output, torch.Tensor)
    strategy.backward(output.sum(), model)
    assert layer.weight.grad is not None
    assert torch.linalg.vector_norm(layer.weight.grad).item() == pytest.approx(5.0 * 1024)

    norm = strategy.clip_gradients_norm(model, optimizer, max_norm=100.0)

    assert norm.item() == pytest.approx(5.0)  # the scale (1024) divided out


def test_parts_are_assignable_before_set_up_as_in_lightning() -> None:
    strategy = DDPStrategy(accelerator="cpu")

    strategy.accelerator = CPUAccelerator()
    strategy.parallel_devices = [torch.device("cpu")] * 2
    strategy.precision_plugin = "bf16-mixed"
    strategy.checkpoint_io = "async"

    assert isinstance(strategy.accelerator, CPUAccelerator)
    assert strategy.parallel_devices == [torch.device("cpu")] * 2
    assert strategy.precision.compute_dtype == torch.bfloat16
    assert type(strategy.checkpoint_io).__name__ == "AsyncCheckpointIO"
    # The ranks a launcher starts are made with the parts assigned.
    copy = pickle.loads(pickle.dumps(strategy))
    assert copy.parallel_devices == [torch.device("cpu")] * 2
    assert copy.precision.name == "bf16-mixed"
    assert type(copy.checkpoint_io).__name__ == "AsyncCheckpointIO"


def test_an_assigned_part_the_strategy_refuses_leaves_it_as_it_was() -> None:
    strategy = ModelParallelStrategy()

    with pytest.raises(ConfigurationError, match="float16 mixed precision is not supported"):
        strategy.precision = "16-mixed"
    assert isinstance(strategy.precision, TruePrecision)
    single = SingleDeviceStrategy("cpu")
    single.setup_module(nn.Linear(1, 1))
    with pytest.raises(ConfigurationError, match=r"cannot change once the strategy is set up"):
        single.precision = "bf16-true"
    single.teardown()
