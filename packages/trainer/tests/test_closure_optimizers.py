"""Optimizers that step with a closure (LBFGS) under automatic optimization."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import ConfigurationError, seed_everything
from plait.trainer import Callback, Module, Trainer
from plait.trainer.optimization import needs_closure


def _loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1 * torch.randn(32, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=8)


class Fitted(Module):
    """A linear fit by LBFGS, counting how often its step runs."""

    def __init__(self, *, extra: bool = False) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        self.extra = extra
        self.calls = 0

    def loss(self, batch: object) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        self.calls += 1
        loss = self.loss(batch)
        self.log("loss", loss)
        return loss

    @override
    def configure_optimizers(self) -> object:
        lbfgs = torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=4)
        return [lbfgs, torch.optim.SGD(self.parameters(), lr=0.1)] if self.extra else lbfgs


def _trainer(tmp_path: Path, **settings: object) -> Trainer:
    options: dict[str, object] = {
        "accelerator": "cpu",
        "default_root_dir": tmp_path,
        "enable_progress_bar": False,
        "logger": False,
        "enable_checkpointing": False,
        "max_epochs": 2,
        **settings,
    }
    return Trainer(**options)  # type: ignore[arg-type]


def test_only_an_optimizer_whose_step_needs_a_closure_is_stepped_with_one() -> None:
    parameters = [torch.nn.Parameter(torch.zeros(1))]
    assert needs_closure(torch.optim.LBFGS(parameters))
    assert not needs_closure(torch.optim.SGD(parameters, lr=0.1))
    assert not needs_closure(torch.optim.Adam(parameters))


def test_lbfgs_trains_as_a_plain_loop_stepping_it_with_a_closure(tmp_path: Path) -> None:
    seed_everything(0)
    model = Fitted()
    expected = copy.deepcopy(model)
    optimizer = torch.optim.LBFGS(expected.parameters(), lr=0.5, max_iter=4)
    step = cast("Callable[[Callable[[], torch.Tensor]], object]", optimizer.step)  # untyped
    for _ in range(2):
        for batch in _loader():

            def closure(batch: object = batch) -> torch.Tensor:
                optimizer.zero_grad()
                loss = expected.loss(batch)
                torch.autograd.backward(loss)
                return loss.detach()

            step(closure)
    steps: list[int] = []

    class CountSteps(Callback):
        @override
        def on_train_batch_end(
            self, trainer: Trainer, module: Module, outputs: object, batch: object, idx: int
        ) -> None:
            steps.append(trainer.global_step)

    trainer = _trainer(tmp_path, callbacks=[CountSteps()])
    trainer.fit(model, _loader())

    for name, value in expected.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    assert steps == list(range(1, 9))  # one optimizer step per batch
    assert model.calls > 8  # LBFGS evaluated the step several times per batch
    assert trainer.callback_metrics["loss"] < 0.1


def test_an_lbfgs_beside_another_optimizer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="returned 2 optimizers"):
        _trainer(tmp_path).fit(Fitted(extra=True), _loader())


def test_lbfgs_with_accumulated_batches_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="accumulate_grad_batches=2"):
        _trainer(tmp_path, accumulate_grad_batches=2).fit(Fitted(), _loader())
