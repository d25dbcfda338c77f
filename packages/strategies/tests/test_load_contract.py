"""One save, load and no_sync contract, and the errors that keep a loop from going wrong.

`tests/test_own_loop.py` runs the same loop on every strategy across processes;
these are the rules, in one process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from plait.core import CheckpointError, ConfigurationError, free_port
from plait.strategies import BaseStrategy, DDPStrategy, SingleDeviceStrategy


class Counter:
    """A `Stateful` of the user's own."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, object]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, object]) -> None:
        seen = state["seen"]
        assert isinstance(seen, int)
        self.seen = seen


def _trained(strategy: BaseStrategy, steps: int = 3) -> dict[str, object]:
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    model, [optimizer] = strategy.setup_module_and_optimizers(
        layer, [torch.optim.Adam(layer.parameters(), lr=0.1)]
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    counter = Counter()
    for _ in range(steps):
        strategy.backward(model(torch.ones(4, 3)).pow(2).sum(), model)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        scheduler.step()
        counter.seen += 4
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "counter": counter}


@pytest.fixture
def strategy() -> Iterator[SingleDeviceStrategy]:
    made = SingleDeviceStrategy("cpu")
    yield made
    made.teardown()


def test_one_call_restores_everything_in_place_and_returns_what_nothing_took(
    strategy: SingleDeviceStrategy, tmp_path: Path
) -> None:
    saved = _trained(strategy)
    strategy.save_checkpoint({**saved, "step": 3, "note": "kept"}, tmp_path / "last.pt")

    fresh = _trained(SingleDeviceStrategy("cpu"), steps=0)
    state: dict[str, object] = {**fresh, "step": 0}
    left = strategy.load_checkpoint(tmp_path / "last.pt", state)

    assert left == {"note": "kept"}  # not asked for: given back
    assert state["step"] == 3  # values are replaced in the mapping
    for name in ("model", "optimizer", "scheduler", "counter"):
        assert state[name] is fresh[name]  # objects are restored, not replaced
    model, original = fresh["model"], saved["model"]
    assert isinstance(model, nn.Module)
    assert isinstance(original, nn.Module)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), original.parameters(), strict=True)
    )
    for name in ("optimizer", "scheduler", "counter"):
        mine, theirs = fresh[name], saved[name]
        assert str(mine.state_dict()) == str(theirs.state_dict()), name  # type: ignore[attr-defined]


def test_the_module_alone_is_restored_in_place_on_every_strategy_not_only_returned(
    strategy: SingleDeviceStrategy, tmp_path: Path
) -> None:
    saved = _trained(strategy)
    strategy.save_checkpoint({"model": saved["model"], "step": 3}, tmp_path / "last.pt")
    fresh = nn.Linear(3, 2)

    left = strategy.load_checkpoint(tmp_path / "last.pt", fresh)

    model = saved["model"]
    assert isinstance(model, nn.Linear)
    assert torch.equal(fresh.weight, model.weight)
    assert left == {"step": 3}


def test_the_module_alone_leaves_the_optimizer_as_it_was_and_gives_back_the_runs_entries(
    strategy: SingleDeviceStrategy, tmp_path: Path
) -> None:
    saved = _trained(strategy)
    strategy.save_checkpoint({**saved, "step": 3}, tmp_path / "last.pt")
    fresh = _trained(SingleDeviceStrategy("cpu"), steps=1)
    optimizer = fresh["optimizer"]
    assert isinstance(optimizer, torch.optim.Adam)
    before = {key: value.clone() for key, value in optimizer.state_dict()["state"][0].items()}

    model = fresh["model"]
    assert isinstance(model, nn.Module)
    left = strategy.load_checkpoint(tmp_path / "last.pt", model)

    assert sorted(left) == ["counter", "scheduler", "step"]  # no strategy's own entry
    after = optimizer.state_dict()["state"][0]
    assert all(torch.equal(after[key], value) for key, value in before.items())


def test_what_loading_gave_back_is_refused_by_set_state_dict_naming_the_line_to_write(
    strategy: SingleDeviceStrategy, tmp_path: Path
) -> None:
    saved = _trained(strategy)
    strategy.save_checkpoint({**saved, "step": 3}, tmp_path / "last.pt")
    model, optimizer = saved["model"], saved["optimizer"]
    assert isinstance(model, nn.Module)
    assert isinstance(optimizer, torch.optim.Optimizer)

    checkpoint = strategy.load_checkpoint(tmp_path / "last.pt", model)
    with pytest.raises(
        CheckpointError, match=r"is what load_checkpoint\(path, model\) gave back"
    ) as raised:
        strategy.set_state_dict(model, [optimizer], checkpoint)
    assert "strategy.load_checkpoint(path, {'model': model, 'optimizer': optimizer})" in str(
        raised.value.fix
    )
    # What it says to write works: reading first, then restoring.
    read = strategy.read_checkpoint(tmp_path / "last.pt", model)
    strategy.set_state_dict(model, [optimizer], read)


def test_without_a_state_nothing_is_restored_and_the_whole_checkpoint_is_returned(
    strategy: SingleDeviceStrategy, tmp_path: Path
) -> None:
    saved = _trained(strategy)
    strategy.save_checkpoint({"model": saved["model"], "step": 3}, tmp_path / "last.pt")

    whole = strategy.load_checkpoint(tmp_path / "last.pt")

    assert whole["step"] == 3
    model, module_state = saved["model"], whole["state_dict"]
    assert isinstance(model, nn.Module)
    assert isinstance(module_state, dict)
    assert module_state.keys() == model.state_dict().keys()


def test_an_entry_the_checkpoint_does_not_hold_is_named_with_what_it_holds(
    strategy: SingleDeviceStrategy, tmp_path: Path
) -> None:
    saved = _trained(strategy)
    strategy.save_checkpoint({"model": saved["model"], "step": 3}, tmp_path / "last.pt")

    fresh = nn.Linear(3, 2)
    before = fresh.weight.detach().clone()
    with pytest.raises(CheckpointError, match=r"holds no 'counter' \(it holds 'step'\)") as caught:
        strategy.load_checkpoint(tmp_path / "last.pt", {"model": fresh, "counter": Counter()})
    assert "leave that entry out" in str(caught.value.fix)
    assert torch.equal(fresh.weight, before)  # refused before anything was restored


def test_a_checkpoint_of_another_model_is_refused_naming_what_differs(
    strategy: SingleDeviceStrategy, tmp_path: Path
) -> None:
    saved = _trained(strategy)
    strategy.save_checkpoint({"model": saved["model"]}, tmp_path / "last.pt")

    with pytest.raises(
        CheckpointError, match=r"does not fit the model: 'weight' has shape \(2, 3\)"
    ):
        strategy.load_checkpoint(tmp_path / "last.pt", nn.Linear(5, 2))


def test_a_checkpoint_without_a_module_state_never_loads_silently(
    strategy: SingleDeviceStrategy, tmp_path: Path
) -> None:
    strategy.save_checkpoint({"step": 3}, tmp_path / "last.pt")

    with pytest.raises(CheckpointError, match=r"holds no module state"):
        strategy.load_checkpoint(tmp_path / "last.pt", nn.Linear(3, 2))


def test_optimizers_are_matched_by_the_names_they_were_saved_under(
    strategy: SingleDeviceStrategy, tmp_path: Path
) -> None:
    saved = _trained(strategy)
    strategy.save_checkpoint(
        {"model": saved["model"], "adam": saved["optimizer"]}, tmp_path / "c.pt"
    )
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)

    with pytest.raises(
        CheckpointError, match=r"holds the optimizers 'adam', and the state names 'optimizer'"
    ):
        strategy.load_checkpoint(tmp_path / "c.pt", {"model": model, "optimizer": optimizer})
    strategy.load_checkpoint(tmp_path / "c.pt", {"model": model, "adam": optimizer})
    assert optimizer.state_dict()["state"][0]["step"] == 3


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"a": nn.Linear(1, 1), "b": nn.Linear(1, 1)}, "the state holds two modules, 'a' and 'b'"),
        (
            {"optimizer": torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)},
            "the state holds the optimizer 'optimizer' and no module",
        ),
        ({"model": nn.Linear(1, 1), "precision": 1}, "the state uses the name 'precision'"),
    ],
    ids=["two-modules", "optimizer-without-module", "reserved-name"],
)
def test_a_state_that_cannot_be_saved_or_loaded_is_refused_before_any_work(
    strategy: SingleDeviceStrategy, tmp_path: Path, state: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        strategy.save_checkpoint(state, tmp_path / "c.pt")
    with pytest.raises(ConfigurationError, match=message):
        strategy.load_checkpoint(tmp_path / "c.pt", state)
    assert not (tmp_path / "c.pt").exists()


def test_values_are_given_back_only_into_a_mapping_that_can_take_them(
    strategy: SingleDeviceStrategy, tmp_path: Path
) -> None:
    saved = _trained(strategy)
    strategy.save_checkpoint({"model": saved["model"], "step": 3}, tmp_path / "c.pt")

    with pytest.raises(ConfigurationError, match=r"a mappingproxy cannot be updated"):
        strategy.load_checkpoint(
            tmp_path / "c.pt", MappingProxyType({"model": nn.Linear(3, 2), "step": 0})
        )


def test_stepping_inside_no_sync_is_refused_and_after_it_goes_on(
    strategy: SingleDeviceStrategy,
) -> None:
    layer = nn.Linear(3, 1)
    model, [optimizer] = strategy.setup_module_and_optimizers(
        layer, [torch.optim.SGD(layer.parameters(), lr=0.1)]
    )
    with strategy.no_sync(model):
        strategy.backward(model(torch.ones(2, 3)).sum(), model)
        with pytest.raises(
            ConfigurationError, match="optimizer_step was called inside no_sync"
        ) as caught:
            strategy.optimizer_step(optimizer)
    assert "enabled=not last_micro_batch" in str(caught.value.fix)
    strategy.optimizer_step(optimizer)  # outside the block: the step goes on
    with strategy.no_sync(model, enabled=False):  # no block at all
        strategy.optimizer_step(optimizer)


def test_ddp_no_sync_needs_the_wrapper_and_skips_the_all_reduce(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                            "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}.items():  # fmt: skip
        monkeypatch.setenv(variable, value)
    strategy = DDPStrategy(accelerator="cpu")
    strategy.setup_environment()
    try:
        inner = nn.Linear(2, 1)
        wrapped = strategy.setup_module(inner)
        assert isinstance(wrapped, DistributedDataParallel)
        with (
            pytest.raises(
                ConfigurationError, match="inside the strategy's DistributedDataParallel"
            ) as caught,
            strategy.no_sync(inner),
        ):
            pass
        assert "setup_module" in str(caught.value.fix)
        with strategy.no_sync(wrapped):
            assert not wrapped.require_backward_grad_sync  # DDP's own flag: no all-reduce
        assert wrapped.require_backward_grad_sync
    finally:
        strategy.teardown()
