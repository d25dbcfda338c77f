"""Manual optimization in one process: the user's step steps the optimizers itself."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import ConfigurationError, seed_everything
from plait.precision import MixedPrecision
from plait.trainer import Callback, Module, Trainer
from plait.trainer.optimization import TrainerOptimizer


def _loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


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


def _pair(output: object) -> tuple[TrainerOptimizer, TrainerOptimizer]:
    assert isinstance(output, list)
    first, second = output
    assert isinstance(first, TrainerOptimizer)
    assert isinstance(second, TrainerOptimizer)
    return first, second


class TwoParts(Module):
    """An encoder and a head, each with its own optimizer, stepped by hand.

    The head steps every batch; the encoder accumulates two batches by hand, and
    its scheduler is stepped by the step as well.
    """

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.encoder = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 1)
        self.rates: list[float] = []

    def loss(self, batch: object) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        return torch.nn.functional.mse_loss(self.head(torch.tanh(self.encoder(x))), y)

    @override
    def training_step(self, batch: object, batch_idx: int) -> None:
        encoder_opt, head_opt = _pair(self.optimizers())
        scheduler = self.lr_schedulers()
        assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR)
        # The head: one step per batch, only its own parameters taking gradients.
        self.toggle_optimizer(head_opt)
        head_opt.zero_grad()
        self.manual_backward(self.loss(batch))
        self.clip_gradients(head_opt, gradient_clip_val=0.5)
        head_opt.step()
        self.untoggle_optimizer(head_opt)
        # The encoder: two batches accumulated, then a step and a scheduler step.
        last = batch_idx % 2 == 1
        with encoder_opt.toggle_model(sync_grad=last):
            self.manual_backward(self.loss(batch) / 2)
        if last:
            encoder_opt.step()
            encoder_opt.zero_grad()
            scheduler.step()
        self.rates.append(float(encoder_opt.param_groups[0]["lr"]))  # type: ignore[arg-type]
        self.log("loss", self.loss(batch))

    @override
    def configure_optimizers(self) -> object:
        encoder = torch.optim.SGD(self.encoder.parameters(), lr=0.1)
        head = torch.optim.Adam(self.head.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(encoder, step_size=1, gamma=0.5)
        return [encoder, head], [scheduler]


def _by_hand(model: TwoParts, epochs: int) -> TwoParts:
    """The same training as a plain loop writes it."""
    model = copy.deepcopy(model)
    encoder = torch.optim.SGD(model.encoder.parameters(), lr=0.1)
    head = torch.optim.Adam(model.head.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(encoder, step_size=1, gamma=0.5)
    for _ in range(epochs):
        for batch_idx, batch in enumerate(_loader()):
            for parameter in model.encoder.parameters():
                parameter.requires_grad = False
            head.zero_grad()
            torch.autograd.backward(model.loss(batch))
            torch.nn.utils.clip_grad_norm_(model.head.parameters(), 0.5)
            head.step()
            for parameter in model.encoder.parameters():
                parameter.requires_grad = True
            for parameter in model.head.parameters():
                parameter.requires_grad = False
            torch.autograd.backward(model.loss(batch) / 2)
            for parameter in model.head.parameters():
                parameter.requires_grad = True
            if batch_idx % 2 == 1:
                encoder.step()
                encoder.zero_grad()
                scheduler.step()
    return model


def test_a_step_that_steps_its_own_optimizers_trains_as_a_plain_loop(tmp_path: Path) -> None:
    seed_everything(0)
    model = TwoParts()
    expected = _by_hand(model, epochs=2)
    trainer = _trainer(tmp_path)

    trainer.fit(model, _loader())

    for name, value in expected.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    # Every optimizer step counts: 6 head steps and 3 encoder steps an epoch.
    assert trainer.global_step == 2 * (6 + 3)
    # The trainer never stepped the scheduler: the step did, once per encoder step.
    assert model.rates == pytest.approx([0.1 * 0.5 ** ((i + 1) // 2) for i in range(12)])
    assert "loss" in trainer.callback_metrics
    # A toggled optimizer gave every parameter its requires_grad back.
    assert all(parameter.requires_grad for parameter in model.parameters())


def test_every_manual_step_tells_the_callbacks_before_it_steps(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []

    class Record(Callback):
        @override
        def on_before_optimizer_step(
            self, trainer: Trainer, module: Module, optimizer: torch.optim.Optimizer
        ) -> None:
            seen.append((trainer.global_step, len(optimizer.param_groups[0]["params"])))

    _trainer(tmp_path, max_epochs=1, callbacks=[Record()]).fit(TwoParts(), _loader())

    # Batch by batch: the head (2 tensors), and the encoder (2) at every second batch.
    head, encoder = 2, 2
    expected: list[tuple[int, int]] = []
    for batch_idx in range(6):
        expected.append((len(expected), head))
        if batch_idx % 2 == 1:
            expected.append((len(expected), encoder))
    assert seen == expected


def test_manual_backward_calls_the_backward_hooks_around_each_pass(tmp_path: Path) -> None:
    seen: list[str] = []

    class Recorded(TwoParts):
        @override
        def on_before_backward(self, loss: torch.Tensor) -> None:
            seen.append(f"before {loss.requires_grad}")

        @override
        def on_after_backward(self) -> None:
            seen.append(f"after {self.head.weight.grad is not None}")

        @override
        def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
            seen.append("step")

    _trainer(tmp_path, max_epochs=1, limit_train_batches=2).fit(Recorded(), _loader())

    # Each batch: the head's pass and step, then the encoder's pass (a step every second).
    first = ["before True", "after True", "step", "before True", "after True"]
    assert seen == [*first, *first, "step"]


def test_a_stepping_inside_toggle_model_without_sync_is_refused(tmp_path: Path) -> None:
    class StepsTooEarly(TwoParts):
        @override
        def training_step(self, batch: object, batch_idx: int) -> None:
            optimizer, _ = _pair(self.optimizers())
            with optimizer.toggle_model(sync_grad=False):
                self.manual_backward(self.loss(batch))
                optimizer.step()

    with pytest.raises(ConfigurationError, match="inside no_sync"):
        _trainer(tmp_path).fit(StepsTooEarly(), _loader())


def test_toggling_a_second_optimizer_before_untoggling_the_first_is_refused(
    tmp_path: Path,
) -> None:
    class TogglesTwice(TwoParts):
        @override
        def training_step(self, batch: object, batch_idx: int) -> None:
            first, second = _pair(self.optimizers())
            self.toggle_optimizer(first)
            self.toggle_optimizer(second)

    with pytest.raises(ConfigurationError, match="another optimizer is toggled"):
        _trainer(tmp_path).fit(TogglesTwice(), _loader())


def test_optimizers_outside_a_run_name_where_to_call_them() -> None:
    model = TwoParts()
    model._trainer = _trainer(Path("."), logger=False)

    with pytest.raises(ConfigurationError, match=r"optimizers\(\) was called where no run"):
        model.optimizers()


def test_automatic_optimization_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="automatic_optimization='no'"):
        TwoParts().automatic_optimization = "no"  # type: ignore[assignment]


def test_manual_backward_and_step_go_through_the_gradient_scaler(tmp_path: Path) -> None:
    class OneOptimizer(Module):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.net = torch.nn.Linear(4, 1)
            self.scales: list[float] = []

        @override
        def training_step(self, batch: object, batch_idx: int) -> None:
            assert isinstance(batch, list)
            x, y = batch
            optimizer = self.optimizers()
            assert not isinstance(optimizer, list)
            optimizer.zero_grad()
            self.manual_backward(torch.nn.functional.mse_loss(self.net(x).float(), y))
            scaler = getattr(self.trainer.strategy.precision, "scaler", None)
            self.scales.append(float(scaler.get_scale()) if scaler is not None else 1.0)
            optimizer.step()

        @override
        def configure_optimizers(self) -> object:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    seed_everything(0)
    scaled = OneOptimizer()
    start = scaled.net.weight.detach().clone()
    # float16 on the CPU by instance: by name the CPU's "16-mixed" is bf16-mixed.
    fp16 = MixedPrecision("16-mixed", device_type="cpu")
    _trainer(tmp_path, plugins=[fp16], max_epochs=1).fit(scaled, _loader())

    # The loss was scaled (by 2**16 to start with), and each step went through the
    # scaler: skipped while the scaled gradients overflowed float16, the scale halving
    # (the scaler's update), and otherwise taken on unscaled gradients (moves of the
    # size of the learning rate's, not 2**13 times them).
    assert scaled.scales[0] == 2.0**16
    assert scaled.scales[-1] < scaled.scales[0]
    moved = (scaled.net.weight.detach() - start).abs().max().item()
    assert 0 < moved < 1
