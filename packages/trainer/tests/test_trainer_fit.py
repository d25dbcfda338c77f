"""The loops in one process: training, evaluation, logging, schedulers, callbacks, resuming."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import pickle
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from rich.console import Console
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.checkpoint_io import AsyncCheckpointIO, TorchCheckpointIO
from plait.core import (
    CheckpointError,
    ConfigurationError,
    RunProgress,
    SupportsProcessDataloader,
    seed_everything,
)
from plait.strategies import SingleDeviceStrategy
from plait.trainer import (
    Callback,
    CSVLogger,
    DataModule,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    Module,
    RichModelSummary,
    RichProgressBar,
    TensorBoardLogger,
    Trainer,
)
from plait.trainer.checkpointing import newest_checkpoint
from plait.trainer.hooks import Hooks

if TYPE_CHECKING:
    from plait.core.typing import PathLike


def _xy(batch: object) -> tuple[torch.Tensor, torch.Tensor]:
    assert isinstance(batch, list | tuple)
    x, y = batch
    assert isinstance(x, torch.Tensor)
    assert isinstance(y, torch.Tensor)
    return x, y


def _data(n: int = 64, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return TensorDataset(x, y)


def _loader(
    n: int = 64, batch_size: int = 8, shuffle: bool = True
) -> DataLoader[tuple[torch.Tensor, ...]]:
    return DataLoader(_data(n), batch_size=batch_size, shuffle=shuffle)


class Regressor(Module):
    """A small model with dropout, so that resuming must restore the random state."""

    def __init__(self, lr: float = 0.01, dropout: float = 0.1) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(dropout), torch.nn.Linear(16, 1)
        )
        self.losses: list[float] = []
        self.schedule: str | None = None

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        x, y = _xy(batch)
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.item())
        self.log("train_loss", loss, prog_bar=True, on_epoch=True)
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        x, y = _xy(batch)
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), prog_bar=True)
        self.log("val_seen", len(x), reduce_fx="sum")

    @override
    def test_step(self, batch: object, batch_idx: int) -> None:
        x, y = _xy(batch)
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y))

    @override
    def predict_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        x, _ = _xy(batch)
        return self.forward(x)

    @override
    def configure_optimizers(self) -> object:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        if self.schedule == "step":
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }
        if self.schedule == "epoch":
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
            return ([optimizer], [scheduler])
        if self.schedule == "plateau":
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"},
            }
        return optimizer


def _trainer(tmp_path: Path, **settings: object) -> Trainer:
    defaults: dict[str, object] = {
        "accelerator": "cpu",
        "default_root_dir": tmp_path,
        "enable_progress_bar": False,
        "logger": False,
    }
    return Trainer(**{**defaults, **settings})  # type: ignore[arg-type]


def test_fit_trains_and_validates(tmp_path: Path) -> None:
    seed_everything(0)
    model = Regressor()
    trainer = _trainer(tmp_path, max_epochs=6)

    trainer.fit(model, _loader(), _loader(shuffle=False))

    assert trainer.current_epoch == 6
    assert trainer.global_step == 6 * 8
    assert model.losses[-1] < model.losses[0] / 4
    metrics = trainer.callback_metrics
    assert metrics["val_seen"] == 64  # an int count, summed, stays an int
    assert isinstance(metrics["val_seen"], int)
    assert {"train_loss", "train_loss_step", "train_loss_epoch", "val_loss"} <= set(metrics)
    assert not model.attached  # the trainer lets go of the module after the run


def test_validate_test_and_predict_return_their_results(tmp_path: Path) -> None:
    model = Regressor()
    trainer = _trainer(tmp_path)

    [validated] = trainer.validate(model, _loader(shuffle=False))
    [tested] = trainer.test(model, _loader(shuffle=False))
    predictions = trainer.predict(model, _loader(n=20, batch_size=8, shuffle=False))

    assert set(validated) == {"val_loss", "val_seen"}
    assert validated["val_seen"] == 64
    assert set(tested) == {"test_loss"}
    assert [tuple(p.shape) for p in predictions] == [(8, 1), (8, 1), (4, 1)]  # type: ignore[attr-defined]
    expected = model(_data(20).tensors[0])
    assert torch.allclose(torch.cat(predictions), expected)  # type: ignore[arg-type]


def test_an_epoch_mean_is_weighted_by_batch_size(tmp_path: Path) -> None:
    class Means(Regressor):
        @override
        def validation_step(self, batch: object, batch_idx: int) -> None:
            _x, _ = _xy(batch)
            self.log("mean_index", float(batch_idx))  # batches of 8, 8 and 4

    [result] = _trainer(tmp_path).validate(Means(), _loader(n=20, batch_size=8, shuffle=False))

    assert result["mean_index"] == pytest.approx((0 * 8 + 1 * 8 + 2 * 4) / 20)


def test_limits_and_validation_interval(tmp_path: Path) -> None:
    class Counting(Regressor):
        validations = 0

        @override
        def on_validation_epoch_start(self) -> None:
            self.validations += 1

    model = Counting()
    trainer = _trainer(
        tmp_path, max_epochs=2, limit_train_batches=0.5, val_check_interval=2, limit_val_batches=1
    )

    trainer.fit(model, _loader(), _loader(shuffle=False))

    assert trainer.global_step == 2 * 4
    assert model.validations == 2 * 2


def test_max_steps_stops_mid_epoch(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_steps=5)

    trainer.fit(Regressor(), _loader())

    assert trainer.global_step == 5
    assert trainer.current_epoch == 1


def test_accumulating_two_half_batches_equals_one_whole_batch(tmp_path: Path) -> None:
    class Plain(Regressor):
        def __init__(self) -> None:
            super().__init__(dropout=0.0)

        @override
        def configure_optimizers(self) -> object:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    accumulated = Plain()
    whole = Plain()
    whole.load_state_dict(accumulated.state_dict())

    _trainer(tmp_path, max_steps=1, accumulate_grad_batches=2).fit(
        accumulated, _loader(n=16, batch_size=8, shuffle=False)
    )
    _trainer(tmp_path, max_steps=1).fit(whole, _loader(n=16, batch_size=16, shuffle=False))

    for a, b in zip(accumulated.parameters(), whole.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_gradient_clipping_bounds_the_update(tmp_path: Path) -> None:
    class Big(Regressor):
        @override
        def configure_optimizers(self) -> object:
            return torch.optim.SGD(self.parameters(), lr=1.0)

    torch.manual_seed(0)
    model = Big(dropout=0.0)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])

    _trainer(tmp_path, max_steps=1, gradient_clip_val=0.01).fit(model, _loader(shuffle=False))

    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (after - before).norm() <= 0.01 + 1e-6


def test_a_step_scheduler_steps_after_optimizer_steps(tmp_path: Path) -> None:
    monitor = LearningRateMonitor(logging_interval="step")
    model = Regressor(lr=0.1)
    model.schedule = "step"

    _trainer(tmp_path, max_steps=7, callbacks=[monitor]).fit(model, _loader())

    rates = [r["lr-SGD"] for _, r in monitor.history]
    assert rates == pytest.approx([0.1] * 3 + [0.05] * 3 + [0.025])


def test_schedulers_by_epoch_and_on_a_plateau_change_the_learning_rate(tmp_path: Path) -> None:
    rates: list[float] = []

    class Record(Callback):
        @override
        def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
            rates.append(trainer.optimizers[0].param_groups[0]["lr"])

    model = Regressor(lr=0.1)
    model.schedule = "epoch"
    _trainer(tmp_path, max_epochs=3, callbacks=[Record()]).fit(model, _loader())
    assert rates == pytest.approx([0.1, 0.01, 0.001])

    rates.clear()

    class Flat(Regressor):
        @override
        def validation_step(self, batch: object, batch_idx: int) -> None:
            self.log("val_loss", 1.0)

    plateau = Flat(lr=0.1)
    plateau.schedule = "plateau"
    _trainer(tmp_path, max_epochs=3, callbacks=[Record()]).fit(
        plateau, _loader(), _loader(shuffle=False)
    )
    assert rates == pytest.approx([0.1, 0.1, 0.05])


def test_the_learning_rate_monitor_logs_each_epoch(tmp_path: Path) -> None:
    monitor = LearningRateMonitor()
    model = Regressor(lr=0.1)
    model.schedule = "epoch"

    _trainer(tmp_path, max_epochs=2, callbacks=[monitor]).fit(model, _loader())

    assert [rates for _, rates in monitor.history] == [
        {"lr-SGD": pytest.approx(0.1)},
        {"lr-SGD": pytest.approx(0.01)},
    ]


def test_every_batch_calls_the_hooks_a_callback_or_module_defines(tmp_path: Path) -> None:
    # The per-batch events leave out the base classes' empty hooks; a hook a class
    # defines, or one set on the instance, still runs at every batch, in order.
    events: list[str] = []

    class Starts(Callback):
        @override
        def on_train_batch_start(
            self, trainer: Trainer, module: Module, batch: object, batch_idx: int
        ) -> None:
            events.append(f"callback_start:{batch_idx}")

    class Silent(Callback):
        pass

    class Hooked(Regressor):
        @override
        def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
            events.append(f"module_end:{batch_idx}")

    patched = Silent()

    def before_step(trainer: Trainer, module: Module, optimizer: torch.optim.Optimizer) -> None:
        events.append("patched_before_step")

    patched.on_before_optimizer_step = before_step  # type: ignore[method-assign]

    _trainer(tmp_path, max_epochs=1, callbacks=[Silent(), Starts(), patched]).fit(
        Hooked(), _loader(n=16)
    )

    assert events == [
        "callback_start:0", "patched_before_step", "module_end:0",
        "callback_start:1", "patched_before_step", "module_end:1",
    ]  # fmt: skip


def test_a_batch_event_nobody_defines_is_not_called_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hook nobody defines costs nothing: the loops skip the event's call itself,
    # and call it again for a run whose module defines the hook.
    called: list[str] = []
    for event in ("on_train_batch_start", "on_before_backward", "on_after_backward"):
        kept = getattr(Hooks, event)

        def counted(
            self: Hooks, *args: object, _event: str = event, _kept: Callable[..., object] = kept
        ) -> None:
            called.append(_event)
            _kept(self, *args)

        counted.__wrapped__ = counted  # type: ignore[attr-defined] # what Hooks binds unprofiled
        monkeypatch.setattr(Hooks, event, counted)

    _trainer(tmp_path, max_epochs=1).fit(Regressor(), _loader(n=16))
    assert called == []

    class Hooked(Regressor):
        @override
        def on_before_backward(self, loss: torch.Tensor) -> None:
            pass

    _trainer(tmp_path, max_epochs=1).fit(Hooked(), _loader(n=16))
    assert called == ["on_before_backward"] * 2


def test_hooks_run_in_order(tmp_path: Path) -> None:
    events: list[str] = []

    class Recorder(Callback):
        @override
        def setup(self, trainer: Trainer, module: Module, stage: str) -> None:
            events.append(f"setup:{stage}")

        @override
        def on_fit_start(self, trainer: Trainer, module: Module) -> None:
            events.append("fit_start")

        @override
        def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
            events.append("epoch_start")

        @override
        def on_train_batch_end(
            self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
        ) -> None:
            events.append("batch_end")

        @override
        def on_before_optimizer_step(
            self, trainer: Trainer, module: Module, optimizer: torch.optim.Optimizer
        ) -> None:
            events.append("before_step")

        @override
        def on_validation_end(self, trainer: Trainer, module: Module) -> None:
            events.append("validation_end")

        @override
        def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
            events.append("epoch_end")

        @override
        def on_fit_end(self, trainer: Trainer, module: Module) -> None:
            events.append("fit_end")

        @override
        def teardown(self, trainer: Trainer, module: Module, stage: str) -> None:
            events.append(f"teardown:{stage}")

    _trainer(tmp_path, max_epochs=1, callbacks=[Recorder()]).fit(
        Regressor(), _loader(n=16), _loader(n=8, shuffle=False)
    )

    assert events == [
        "setup:fit", "fit_start", "epoch_start",
        "before_step", "batch_end", "before_step", "batch_end",
        "validation_end", "epoch_end", "fit_end", "teardown:fit",
    ]  # fmt: skip


def test_validation_leaves_the_training_randomness_alone(tmp_path: Path) -> None:
    seed_everything(3)
    without = Regressor()
    initial = {k: v.clone() for k, v in without.state_dict().items()}
    _trainer(tmp_path, max_epochs=2).fit(without, _loader())
    seed_everything(3)
    with_validation = Regressor()
    with_validation.load_state_dict(initial)
    _trainer(tmp_path, max_epochs=2).fit(with_validation, _loader(), _loader(shuffle=False))

    assert with_validation.losses == without.losses


def _run_losses(tmp_path: Path, schedule: str | None = None, **settings: object) -> list[float]:
    seed_everything(7)
    model = Regressor()
    model.schedule = schedule
    _trainer(tmp_path, **settings).fit(model, _loader(), _loader(n=16, shuffle=False))
    return model.losses


@pytest.mark.parametrize("schedule", [None, "step", "epoch", "plateau"])
@pytest.mark.parametrize("stop_after", [5, 8, 13], ids=["mid-epoch", "epoch-end", "second-epoch"])
def test_a_resumed_run_continues_exactly(
    tmp_path: Path, stop_after: int, schedule: str | None
) -> None:
    whole = _trainer(tmp_path / "whole", max_epochs=3, enable_checkpointing=False)
    seed_everything(7)
    whole_model = Regressor()
    whole_model.schedule = schedule
    whole.fit(whole_model, _loader(), _loader(n=16, shuffle=False))
    uninterrupted = whole_model.losses

    checkpoint = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=stop_after, save_top_k=0)
    first = _run_losses(tmp_path / "part", schedule, max_steps=stop_after, callbacks=[checkpoint])
    seed_everything(123)  # a resumed run restores the random state; the seed here does not matter
    resumed_model = Regressor()
    resumed_model.schedule = schedule
    resumed = _trainer(
        tmp_path / "part",
        max_epochs=3,
        callbacks=[
            ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=stop_after, save_top_k=0)
        ],
    )
    resumed.fit(resumed_model, _loader(), _loader(n=16, shuffle=False), ckpt_path="last")

    assert len(first) == stop_after
    assert first + resumed_model.losses == uninterrupted
    assert resumed.global_step == 24
    # An epoch cut short by max_steps steps its schedulers once, when it really ends:
    # a second step would change the next epoch's learning rate, so its losses.
    for name, value in whole_model.state_dict().items():
        assert torch.equal(resumed_model.state_dict()[name], value), name


def test_last_resumes_from_a_checkpoint_newer_than_last_ckpt(tmp_path: Path) -> None:
    # A run stopped after writing step 8's checkpoint, before last.ckpt followed it.
    saving = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    _trainer(tmp_path, max_steps=8, callbacks=[saving]).fit(Regressor(), _loader())
    folder = tmp_path / "ckpt"
    os.remove(folder / "last.ckpt")
    os.link(folder / "epoch=0-step=4.ckpt", folder / "last.ckpt")
    stamp = os.path.getmtime(folder / "epoch=0-step=8.ckpt") - 10
    os.utime(folder / "epoch=0-step=4.ckpt", (stamp, stamp))

    model = Regressor()
    resumed = _trainer(
        tmp_path,
        max_steps=12,
        callbacks=[ModelCheckpoint(folder, every_n_train_steps=4, save_top_k=-1)],
    )
    with pytest.warns(UserWarning, match=r"step=8.ckpt is newer than .*last.ckpt"):
        resumed.fit(model, _loader(), ckpt_path="last")

    assert len(model.losses) == 4  # steps 9 to 12: nothing done twice
    assert resumed.global_step == 12


def test_the_newest_checkpoint_is_the_last_completed_and_last_ckpt_wins_a_tie(
    tmp_path: Path,
) -> None:
    # A directory of parts completes with the last entry written in it.
    older, sharded = tmp_path / "epoch=0.ckpt", tmp_path / "epoch=1.ckpt"
    older.write_bytes(b"0")
    sharded.mkdir()
    (sharded / ".metadata").write_bytes(b"1")
    os.utime(sharded, (1, 1))  # the directory itself, made long ago
    os.utime(older, (100, 100))

    assert newest_checkpoint(str(tmp_path), lambda path: True) == str(sharded)
    os.link(older, tmp_path / "last.ckpt")
    os.utime(sharded / ".metadata", (100, 100))
    os.utime(sharded, (100, 100))
    assert newest_checkpoint(str(tmp_path), lambda path: True) == str(tmp_path / "last.ckpt")


def test_model_checkpoint_keeps_the_best_k_by_a_metric(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(tmp_path / "ckpt", monitor="val_loss", save_top_k=2)
    trainer = _trainer(tmp_path, max_epochs=4, callbacks=[checkpoint])

    trainer.fit(Regressor(), _loader(), _loader(shuffle=False))

    files = sorted(os.listdir(tmp_path / "ckpt"))
    assert len(files) == 3
    assert "last.ckpt" in files
    assert len(checkpoint.best_k_models) == 2
    assert checkpoint.best_model_path in checkpoint.best_k_models
    assert checkpoint.best_model_score == min(checkpoint.best_k_models.values())
    assert os.path.basename(checkpoint.best_model_path).startswith("epoch=")
    loaded = torch.load(checkpoint.best_model_path, weights_only=True)
    assert loaded["state_dict"].keys() == Regressor().state_dict().keys()


def test_model_checkpoint_names_a_missing_metric(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[ModelCheckpoint(monitor="val_los")])

    with pytest.raises(ConfigurationError, match="did you mean 'val_loss'"):
        trainer.fit(Regressor(), _loader(), _loader(shuffle=False))


def test_early_stopping_stops_when_the_metric_stalls(tmp_path: Path) -> None:
    class Stalled(Regressor):
        @override
        def validation_step(self, batch: object, batch_idx: int) -> None:
            self.log("val_loss", 1.0)

    stopper = EarlyStopping("val_loss", patience=2)
    trainer = _trainer(tmp_path, max_epochs=20, callbacks=[stopper])

    trainer.fit(Stalled(), _loader(), _loader(shuffle=False))

    assert trainer.current_epoch == 4  # improves once, then 3 checks without
    assert stopper.stopped_epoch == 3
    assert "did not improve" in stopper.reason


def test_csv_and_tensorboard_loggers_record_the_metrics(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    csv_logger = CSVLogger(tmp_path)
    board = TensorBoardLogger(tmp_path, name="board")
    trainer = _trainer(tmp_path, max_epochs=2, logger=[csv_logger, board], log_every_n_steps=2)

    trainer.fit(Regressor(), _loader(), _loader(shuffle=False))

    with open(csv_logger.path) as file:
        rows = list(csv.DictReader(file))
    steps = [row for row in rows if row.get("train_loss_step")]
    assert [int(row["step"]) for row in steps] == [2, 4, 6, 8, 10, 12, 14, 16]
    epochs = [row for row in rows if row.get("val_loss")]
    assert [int(row["step"]) for row in epochs] == [8, 16]
    assert trainer.log_dir == csv_logger.log_dir == str(tmp_path / "plait_logs" / "version_0")
    events = [name for name in os.listdir(board.log_dir) if name.startswith("events.out.tfevents")]
    assert events
    from tensorboard.backend.event_processing.event_accumulator import (  # noqa: PLC0415 (optional)
        EventAccumulator,
    )

    accumulator = EventAccumulator(board.log_dir)
    accumulator.Reload()
    assert "val_loss" in accumulator.Tags()["scalars"]
    assert [event.step for event in accumulator.Scalars("val_loss")] == [8, 16]


def test_a_test_after_a_fit_adds_its_rows_below_the_fits_from_another_copy_of_the_logger(
    tmp_path: Path,
) -> None:
    # Spawned ranks (ddp_spawn), or a relaunched rank 0, log through a copy of the
    # logger that holds none of the fit's rows: it must continue the file.
    logger = CSVLogger(tmp_path)
    assert logger.log_dir.endswith("version_0")
    copy = pickle.loads(pickle.dumps(logger))
    model = Regressor()
    _trainer(tmp_path, max_epochs=2, logger=logger, log_every_n_steps=2).fit(
        model, _loader(), _loader(shuffle=False)
    )
    with open(logger.path) as file:
        fitted = list(csv.DictReader(file))

    _trainer(tmp_path, logger=copy).test(model, _loader(shuffle=False))

    with open(logger.path) as file:
        reader = csv.DictReader(file)
        rows = list(reader)
        columns = reader.fieldnames or []
    assert [row["step"] for row in rows[: len(fitted)]] == [row["step"] for row in fitted]
    assert [row["train_loss_step"] for row in rows[: len(fitted)]] == [
        row["train_loss_step"] for row in fitted
    ]
    assert len(rows) == len(fitted) + 1
    assert rows[-1]["test_loss"]
    assert not rows[-1]["train_loss_step"]
    assert {"train_loss_step", "val_loss", "test_loss"} <= set(columns)


@pytest.mark.parametrize("kind", [CSVLogger, TensorBoardLogger])
def test_a_logger_sent_to_spawned_ranks_names_the_directory_they_write(
    tmp_path: Path, kind: type[CSVLogger | TensorBoardLogger]
) -> None:
    if kind is TensorBoardLogger:
        pytest.importorskip("tensorboard")
    (tmp_path / "plait_logs" / "version_0").mkdir(parents=True)
    logger = kind(tmp_path)

    sent = pickle.loads(pickle.dumps(logger))
    sent.log_metrics({"loss": 1.0}, step=1)  # rank 0 makes its directory

    # The caller's logger names that directory, not the next free one after it.
    assert logger.log_dir == sent.log_dir == str(tmp_path / "plait_logs" / "version_1")
    sent.finalize("success")


def test_the_progress_bar_prints_a_line_per_epoch_when_not_on_a_terminal(tmp_path: Path) -> None:
    output = io.StringIO()
    bar = RichProgressBar(console=Console(file=output, force_terminal=False, width=200))

    _trainer(tmp_path, max_epochs=2, callbacks=[bar], enable_progress_bar=True).fit(
        Regressor(), _loader(), _loader(shuffle=False)
    )

    lines = output.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("Epoch 0/1: 8 batches")
    assert "it/s" in lines[0]
    assert "train_loss=" in lines[0]
    assert "val_loss=" in lines[0]


def test_the_progress_bar_draws_on_a_terminal(tmp_path: Path) -> None:
    output = io.StringIO()
    console = Console(file=output, force_terminal=True, width=160)
    bar = RichProgressBar(console=console)

    _trainer(tmp_path, max_epochs=1, callbacks=[bar], enable_progress_bar=True).fit(
        Regressor(), _loader()
    )

    drawn = output.getvalue()
    assert "Epoch 0/0" in drawn
    assert "8/8" in drawn


def test_a_datamodule_supplies_the_loaders(tmp_path: Path) -> None:
    calls: list[str] = []

    class Data(DataModule):
        @override
        def prepare_data(self) -> None:
            calls.append("prepare")

        @override
        def setup(self, stage: str) -> None:
            calls.append(f"setup:{stage}")

        @override
        def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
            return _loader()

        @override
        def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
            return _loader(shuffle=False)

    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(Regressor(), datamodule=Data())

    assert calls == ["prepare", "setup:fit"]
    assert "val_loss" in trainer.callback_metrics


# Bad input, caught at the earliest point.


def test_fit_needs_a_plait_module(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"not a plait\.trainer\.Module"):
        _trainer(tmp_path).fit(torch.nn.Linear(1, 1), _loader())  # type: ignore[arg-type]


def test_fit_needs_the_steps(tmp_path: Path) -> None:
    class Empty(Module):
        pass

    with pytest.raises(
        ConfigurationError, match="does not define training_step, configure_optimizers"
    ):
        _trainer(tmp_path).fit(Empty(), _loader())


def test_fit_needs_data_once(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    with pytest.raises(ConfigurationError, match="fit has no data"):
        trainer.fit(Regressor())
    with pytest.raises(ConfigurationError, match="both loaders and a datamodule"):
        trainer.fit(Regressor(), _loader(), datamodule=DataModule())


def test_a_missing_checkpoint_fails_before_anything_runs(tmp_path: Path) -> None:
    model = Regressor()
    with pytest.raises(CheckpointError, match="does not exist"):
        _trainer(tmp_path).fit(model, _loader(), ckpt_path=tmp_path / "nope.ckpt")
    assert model.losses == []


def test_resuming_from_last_without_a_checkpoint_starts_afresh_with_a_warning(
    tmp_path: Path,
) -> None:
    with pytest.warns(UserWarning, match="training starts afresh"):
        _trainer(tmp_path, max_steps=1).fit(Regressor(), _loader(), ckpt_path="last")


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        ("adam", "configure_optimizers returned a str"),
        ([], "returned no optimizer"),
        ({"optimiser": None}, "valid choices: 'optimizer', 'lr_scheduler'"),
        ([torch.nn.Linear(1, 1)], "where an optimizer belongs"),
    ],
)
def test_bad_configure_optimizers_results_are_named(
    tmp_path: Path, returned: object, expected: str
) -> None:
    class Bad(Regressor):
        @override
        def configure_optimizers(self) -> object:
            return returned

    with pytest.raises(ConfigurationError, match=expected.replace("(", r"\(")):
        _trainer(tmp_path).fit(Bad(), _loader())


def test_a_plateau_scheduler_without_a_monitor_is_refused(tmp_path: Path) -> None:
    class Bad(Regressor):
        @override
        def configure_optimizers(self) -> object:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return {
                "optimizer": optimizer,
                "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer),
            }

    with pytest.raises(ConfigurationError, match="ReduceLROnPlateau steps on a metric"):
        _trainer(tmp_path).fit(Bad(), _loader())


@pytest.mark.parametrize(
    ("value", "expected"),
    [(torch.ones(3), "a tensor of shape (3,)"), ("high", "got a str")],
)
def test_logging_a_value_that_is_not_one_number(
    tmp_path: Path, value: object, expected: str
) -> None:
    class Bad(Regressor):
        @override
        def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
            self.log("bad", value)  # type: ignore[arg-type]
            return super().training_step(batch, batch_idx)

    with pytest.raises(ConfigurationError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        _trainer(tmp_path).fit(Bad(), _loader())


def test_logging_outside_a_run_says_where_it_works() -> None:
    with pytest.raises(ConfigurationError, match="not attached to a Trainer"):
        Regressor().log("x", 1.0)


def test_a_bad_reduce_fx_is_named(tmp_path: Path) -> None:
    class Bad(Regressor):
        @override
        def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
            self.log("x", 1.0, reduce_fx="avg")  # type: ignore[arg-type]
            return super().training_step(batch, batch_idx)

    with pytest.raises(ConfigurationError, match="invalid reduce_fx: 'avg'"):
        _trainer(tmp_path).fit(Bad(), _loader())


def test_a_training_step_returning_the_wrong_thing(tmp_path: Path) -> None:
    class Bad(Regressor):
        @override
        def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
            return 1.0  # type: ignore[return-value]

    with pytest.raises(ConfigurationError, match="training_step returned a float"):
        _trainer(tmp_path).fit(Bad(), _loader())


def test_step_level_sync_in_evaluation_is_refused(tmp_path: Path) -> None:
    class Bad(Regressor):
        @override
        def validation_step(self, batch: object, batch_idx: int) -> None:
            self.log("v", 1.0, on_step=True, sync_dist=True)

    with pytest.raises(ConfigurationError, match="on_step=True, sync_dist=True"):
        _trainer(tmp_path).validate(Bad(), _loader())


class BuiltLate(Module):
    """Layers made in configure_model (or its Lightning 1.x name), counted per run."""

    def __init__(self, *, legacy: bool) -> None:
        super().__init__()
        self.net: torch.nn.Linear | None = None
        self.built = 0
        if legacy:
            self.configure_sharded_model = self._build

    def _build(self) -> None:
        self.built += 1
        if self.net is None:
            self.net = torch.nn.Linear(4, 1)

    @override
    def configure_model(self) -> None:
        if not hasattr(self, "configure_sharded_model"):
            self._build()
        else:
            super().configure_model()

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        x, y = _xy(batch)
        assert self.net is not None
        loss: torch.Tensor = torch.nn.functional.mse_loss(self.net(x), y)
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        x, y = _xy(batch)
        assert self.net is not None
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("legacy", [False, True])
def test_layers_made_in_configure_model_train_and_the_hook_runs_once_per_run(
    tmp_path: Path, legacy: bool
) -> None:
    model = BuiltLate(legacy=legacy)
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=1,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, _loader())
    trainer.validate(model, _loader(shuffle=False))

    assert model.net is not None
    assert model.built == 2  # fit, then validate: each run once, the layer made once
    assert "val_loss" in trainer.callback_metrics


class WrappingStrategy(SingleDeviceStrategy):
    """Wraps each loader, as XLA's strategy wraps it in a device loader."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.passes: list[int] = []

    def process_dataloader(self, loader: Iterable[object]) -> Iterable[object]:
        self.passes.append(len(loader))  # type: ignore[arg-type]

        def batches() -> Iterator[object]:
            for batch in loader:
                x, y = _xy(batch)
                yield [x, y * 0.0]  # the wrapper's batches are the ones trained on

        return batches()


def test_the_strategy_wraps_each_pass_over_a_loader(tmp_path: Path) -> None:
    strategy = WrappingStrategy()
    assert isinstance(strategy, SupportsProcessDataloader)
    model = Regressor()
    trainer = _trainer(tmp_path, strategy=strategy, max_epochs=2)
    trainer.fit(model, _loader(), _loader(n=16, shuffle=False))

    # Two training passes of 8 batches, two validation passes of 2.
    assert sorted(strategy.passes) == [2, 2, 8, 8]
    assert len(model.losses) == 16
    # Trained on the wrapper's batches: a zero target, far below the real one's losses.
    assert max(model.losses) < 1.0


def test_the_trainer_calls_the_strategys_lifecycle_hooks_on_every_run(tmp_path: Path) -> None:
    events: list[str] = []

    class Told(SingleDeviceStrategy):
        @override
        def on_fit_start(self, run: RunProgress) -> None:
            events.append(f"fit_start@{run.global_step}")

        @override
        def on_fit_end(self) -> None:
            events.append("fit_end")

        @override
        def on_train_start(self) -> None:
            events.append("train_start")

        @override
        def on_train_end(self) -> None:
            events.append("train_end")

        @override
        def on_validation_start(self) -> None:
            events.append("validation_start")

        @override
        def on_validation_end(self) -> None:
            events.append("validation_end")

        @override
        def on_test_start(self) -> None:
            events.append("test_start")

        @override
        def on_test_end(self) -> None:
            events.append("test_end")

        @override
        def on_predict_start(self) -> None:
            events.append("predict_start")

        @override
        def on_predict_end(self) -> None:
            events.append("predict_end")

        @override
        def teardown(self) -> None:
            events.append("teardown")
            super().teardown()

    trainer = _trainer(tmp_path, max_epochs=2, strategy=Told(device="cpu"))
    model = Regressor()
    trainer.fit(model, _loader(n=16), _loader(n=8, shuffle=False))
    trainer.validate(model, _loader(n=8, shuffle=False))
    trainer.test(model, _loader(n=8, shuffle=False))
    trainer.predict(model, _loader(n=8, shuffle=False))

    assert events == [
        "fit_start@0",
        "train_start",
        "validation_start", "validation_end",
        "validation_start", "validation_end",
        "train_end", "fit_end", "teardown",
        "validation_start", "validation_end", "teardown",
        "test_start", "test_end", "teardown",
        "predict_start", "predict_end", "teardown",
    ]  # fmt: skip


class _HeldIO(TorchCheckpointIO):
    """Writes a save only once someone waits for it: a background write that lags."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    @override
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        assert self.gate.wait(timeout=60), "nobody waited for the save"
        super().save_checkpoint(checkpoint, path)


class _LaggingAsyncIO(AsyncCheckpointIO):
    """`AsyncCheckpointIO` whose saves land only when it is waited on."""

    def __init__(self) -> None:
        self.held = _HeldIO()
        super().__init__(self.held)

    @override
    def wait(self) -> None:
        self.held.gate.set()
        try:
            super().wait()
        finally:
            self.held.gate.clear()


def test_model_checkpoint_removes_what_it_supersedes_while_saves_lag_in_the_background(
    tmp_path: Path,
) -> None:
    checkpoint = ModelCheckpoint(tmp_path / "ckpt", save_top_k=1)
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=[checkpoint], plugins=[_LaggingAsyncIO()])

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "was to be removed, and is already gone"
        trainer.fit(Regressor(), _loader(n=16), _loader(n=16, shuffle=False))

    assert sorted(os.listdir(tmp_path / "ckpt")) == ["epoch=2-step=6.ckpt", "last.ckpt"]
    assert list(checkpoint.best_k_models) == [str(tmp_path / "ckpt" / "epoch=2-step=6.ckpt")]


def test_a_background_checkpoint_io_saves_in_a_fit_after_a_validate(tmp_path: Path) -> None:
    # A Trainer tears its strategy (and its checkpoint IO) down after each run: the
    # same IO must save in the next run, and in another Trainer's.
    io = AsyncCheckpointIO()
    folder = tmp_path / "ckpt"
    trainer = _trainer(
        tmp_path,
        max_epochs=2,
        callbacks=[ModelCheckpoint(folder, save_top_k=-1)],
        plugins=[io],
    )
    model = Regressor()

    trainer.validate(model, _loader(n=16, shuffle=False))
    trainer.fit(model, _loader(n=16), _loader(n=16, shuffle=False))
    trainer.validate(model, _loader(n=16, shuffle=False))
    again = _trainer(
        tmp_path,
        max_epochs=3,
        callbacks=[ModelCheckpoint(folder, save_top_k=-1)],
        plugins=[io],
    )
    again.fit(
        model,
        _loader(n=16),
        _loader(n=16, shuffle=False),
        ckpt_path=str(folder / "epoch=1-step=4.ckpt"),
    )

    assert sorted(os.listdir(folder)) == [
        "epoch=0-step=2.ckpt",
        "epoch=1-step=4.ckpt",
        "epoch=2-step=6.ckpt",
        "last.ckpt",
    ]
    assert torch.load(folder / "epoch=2-step=6.ckpt", weights_only=True)["global_step"] == 6


_HOOKS = (
    "on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start",
    "on_before_backward", "on_after_backward", "on_before_optimizer_step",
    "on_train_batch_end", "on_train_epoch_end", "on_train_end", "on_fit_end",
    "on_validation_start", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_end", "on_test_start", "on_test_epoch_start", "on_test_epoch_end",
    "on_test_end", "on_predict_start", "on_predict_end",
)  # fmt: skip
"""Every hook of the module that Lightning code overrides, as Lightning names them."""


class _Hooked(Regressor):
    """Records each hook the Trainer calls on the module, with the optimizer's step."""

    def __init__(self) -> None:
        super().__init__(dropout=0.0)
        self.called: list[str] = []
        for name in _HOOKS:
            setattr(self, name, self._recorder(name))

    def _recorder(self, name: str) -> Callable[..., None]:
        def record(*args: object) -> None:
            if name == "on_before_backward":
                loss = args[0]
                assert isinstance(loss, torch.Tensor)
                assert loss.requires_grad
            if name == "on_after_backward":
                assert all(p.grad is not None for p in self.parameters())
            self.called.append(name)

        return record


class _RecordingCallback(Callback):
    def __init__(self) -> None:
        self.called: list[str] = []

    @override
    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        self.called.append("on_train_start")

    @override
    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        self.called.append("on_train_end")

    @override
    def on_before_backward(self, trainer: Trainer, module: Module, loss: torch.Tensor) -> None:
        self.called.append("on_before_backward")

    @override
    def on_after_backward(self, trainer: Trainer, module: Module) -> None:
        self.called.append("on_after_backward")


def test_the_module_and_callback_hooks_lightning_code_overrides_are_called_in_order(
    tmp_path: Path,
) -> None:
    model = _Hooked()
    callback = _RecordingCallback()
    trainer = _trainer(
        tmp_path,
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        callbacks=[callback],
    )

    trainer.fit(model, _loader(), _loader(shuffle=False))
    batch = [
        "on_train_batch_start", "on_before_backward", "on_after_backward",
        "on_before_optimizer_step", "on_train_batch_end",
    ]  # fmt: skip
    assert model.called == [
        "on_fit_start", "on_train_start", "on_train_epoch_start", *batch, *batch,
        "on_validation_start", "on_validation_epoch_start", "on_validation_epoch_end",
        "on_validation_end", "on_train_epoch_end", "on_train_end", "on_fit_end",
    ]  # fmt: skip
    assert callback.called == [
        "on_train_start",
        *["on_before_backward", "on_after_backward"] * 2,
        "on_train_end",
    ]

    model.called.clear()
    trainer.test(model, _loader(n=8, shuffle=False))
    trainer.predict(model, _loader(n=8, shuffle=False))
    assert model.called == [
        "on_test_start", "on_test_epoch_start", "on_test_epoch_end", "on_test_end",
        "on_predict_start", "on_predict_end",
    ]  # fmt: skip


def test_model_checkpoint_formats_a_filename_as_it_is_without_auto_inserted_names(
    tmp_path: Path,
) -> None:
    checkpoint = ModelCheckpoint(
        tmp_path / "ckpt",
        filename="epoch_{epoch:03d}",
        auto_insert_metric_name=False,
        save_top_k=-1,
        save_last=False,
    )
    _trainer(tmp_path, max_epochs=2, callbacks=[checkpoint]).fit(Regressor(), _loader(n=16))

    assert sorted(os.listdir(tmp_path / "ckpt")) == ["epoch_000.ckpt", "epoch_001.ckpt"]


def test_a_weights_only_checkpoint_validates_and_is_refused_as_a_place_to_resume(
    tmp_path: Path,
) -> None:
    checkpoint = ModelCheckpoint(tmp_path / "ckpt", save_weights_only=True)
    model = Regressor(dropout=0.0)
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[checkpoint])
    trainer.fit(model, _loader(n=16))

    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert saved["plait"]["weights_only"] is True
    assert "optimizer_states" not in saved
    assert "lr_schedulers" not in saved
    assert saved["state_dict"].keys() == model.state_dict().keys()
    assert saved["global_step"] == 2
    fresh = Regressor(dropout=0.0)
    validated = _trainer(tmp_path).validate(
        fresh, _loader(n=16, shuffle=False), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt")
    )
    same = _trainer(tmp_path).validate(model, _loader(n=16, shuffle=False))
    assert validated == same

    again = _trainer(tmp_path, max_epochs=2, callbacks=[ModelCheckpoint(tmp_path / "ckpt")])
    with pytest.raises(CheckpointError, match="holds the module's weights only") as refused:
        again.fit(Regressor(), _loader(n=16), ckpt_path="last")
    assert "save_weights_only=False" in str(refused.value)


@pytest.mark.parametrize(
    ("save_on_train_epoch_end", "saved_at"),
    [(None, [2, 4, 6, 8]), (False, [2, 4, 6, 8]), (True, [4, 8])],
)
def test_model_checkpoint_saves_after_validations_in_the_middle_of_an_epoch(
    tmp_path: Path, save_on_train_epoch_end: bool | None, saved_at: list[int]
) -> None:
    checkpoint = ModelCheckpoint(
        tmp_path / "ckpt",
        save_top_k=-1,
        save_last=False,
        save_on_train_epoch_end=save_on_train_epoch_end,
    )
    trainer = _trainer(tmp_path, max_epochs=2, val_check_interval=0.5, callbacks=[checkpoint])
    trainer.fit(Regressor(), _loader(n=32), _loader(n=8, shuffle=False))

    steps = sorted(
        int(name.split("step=")[1].split(".")[0]) for name in os.listdir(tmp_path / "ckpt")
    )
    assert steps == saved_at


def test_model_checkpoint_saves_by_the_time_passed_and_only_then(tmp_path: Path) -> None:
    # Any interval a batch outlasts saves after every batch; one no run reaches, never.
    every = ModelCheckpoint(
        tmp_path / "often",
        train_time_interval=timedelta(microseconds=1),
        save_top_k=-1,
        save_last=False,
    )
    never = ModelCheckpoint(
        tmp_path / "never", train_time_interval=timedelta(days=1), save_top_k=-1, save_last=False
    )
    _trainer(tmp_path, max_epochs=2, callbacks=[every]).fit(Regressor(), _loader(n=16))
    _trainer(tmp_path, max_epochs=2, callbacks=[never]).fit(Regressor(), _loader(n=16))

    assert len(os.listdir(tmp_path / "often")) == 4
    assert not (tmp_path / "never").exists() or not os.listdir(tmp_path / "never")


def test_a_verbose_model_checkpoint_says_what_it_keeps_and_removes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = ModelCheckpoint(tmp_path / "ckpt", monitor="val_loss", verbose=True)
    with caplog.at_level(logging.INFO, logger="plait"):
        _trainer(tmp_path, max_epochs=3, callbacks=[checkpoint]).fit(
            Regressor(), _loader(n=16), _loader(n=8, shuffle=False)
        )

    said = [
        record.getMessage()
        for record in caplog.records
        if "ModelCheckpoint," in record.getMessage()
    ]
    assert len(said) == 3
    assert said[0].startswith("ModelCheckpoint, epoch 0, global step 2: 'val_loss' reached ")
    assert "saving " in said[0]
    assert any("removing " in line or "not among the best 1" in line for line in said[1:])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"every_n_train_steps": 5, "train_time_interval": timedelta(minutes=1)},
            "both every_n_train_steps and train_time_interval",
        ),
        ({"train_time_interval": 30}, "train_time_interval=30 must be a positive timedelta"),
        ({"train_time_interval": timedelta(0)}, "must be a positive timedelta"),
        ({"save_weights_only": "yes"}, "save_weights_only='yes' must be True or False"),
        ({"save_on_train_epoch_end": 1.5}, "save_on_train_epoch_end=1.5 must be None"),
    ],
)
def test_model_checkpoint_refuses_settings_that_cannot_hold(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        ModelCheckpoint(**settings)  # type: ignore[arg-type]


class _Stalled(Regressor):
    """Validation that never improves: early stopping's patience runs out."""

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        self.log("val_loss", 1.0)


@pytest.mark.parametrize(
    ("check_on_train_epoch_end", "stopped_at_step"),
    # Validating twice an epoch: by default each validation is a check (improve
    # once, then 3 without: the 4th validation, in the 2nd epoch); at the epoch's
    # end only, the 4th epoch.
    [(None, 8), (False, 8), (True, 16)],
)
def test_early_stopping_checks_after_each_validation_where_a_fit_validates_mid_epoch(
    tmp_path: Path, check_on_train_epoch_end: bool | None, stopped_at_step: int
) -> None:
    stopper = EarlyStopping(
        "val_loss", patience=2, check_on_train_epoch_end=check_on_train_epoch_end
    )
    trainer = _trainer(tmp_path, max_epochs=20, val_check_interval=0.5, callbacks=[stopper])

    trainer.fit(_Stalled(), _loader(n=32), _loader(n=8, shuffle=False))

    assert stopper.wait_count == 3
    assert trainer.global_step == stopped_at_step


def test_early_stopping_that_is_not_strict_warns_once_and_never_stops_without_its_metric(
    tmp_path: Path,
) -> None:
    stopper = EarlyStopping("val_acc", strict=False)
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=[stopper])

    with pytest.warns(UserWarning, match=r"strict=False\) found no such metric") as caught:
        trainer.fit(Regressor(), _loader(n=16), _loader(n=8, shuffle=False))

    assert len([w for w in caught if "found no such metric" in str(w.message)]) == 1
    assert trainer.current_epoch == 3
    assert stopper.stopped_epoch is None
    strict = _trainer(tmp_path, max_epochs=3, callbacks=[EarlyStopping("val_acc")])
    with pytest.raises(ConfigurationError, match="or pass strict=False"):
        strict.fit(Regressor(), _loader(n=16), _loader(n=8, shuffle=False))


def test_a_verbose_early_stopping_says_how_each_check_went(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stopper = EarlyStopping("val_loss", patience=1, verbose=True)
    with caplog.at_level(logging.INFO, logger="plait"):
        _trainer(tmp_path, max_epochs=5, callbacks=[stopper]).fit(
            _Stalled(), _loader(n=16), _loader(n=8, shuffle=False)
        )

    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("EarlyStopping:")]
    assert said == [
        "EarlyStopping: val_loss improved to 1 (min_delta 0.0)",
        "EarlyStopping: val_loss = 1 did not improve on 1 for 1 check(s) (patience 1)",
        "EarlyStopping: val_loss = 1 did not improve on 1 for 2 check(s) (patience 1)",
    ]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"strict": "no"}, "strict='no' must be True or False"),
        ({"verbose": 1}, "verbose=1 must be True or False"),
        ({"check_on_train_epoch_end": "yes"}, "check_on_train_epoch_end='yes' must be None"),
    ],
)
def test_early_stopping_refuses_settings_that_cannot_hold(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        EarlyStopping("val_loss", **settings)  # type: ignore[arg-type]


def test_a_stop_asked_before_min_epochs_waits_for_them(tmp_path: Path) -> None:
    # Patience runs out at the 4th epoch's check; min_epochs holds training to 6.
    stopper = EarlyStopping("val_loss", patience=2)
    trainer = _trainer(tmp_path, max_epochs=20, min_epochs=6, callbacks=[stopper])

    trainer.fit(_Stalled(), _loader(n=16), _loader(n=8, shuffle=False))

    assert stopper.stopped_epoch == 5  # the last check asked again
    assert trainer.current_epoch == 6
    assert trainer.should_stop


def test_a_stop_asked_before_min_steps_waits_for_them(tmp_path: Path) -> None:
    stopper = EarlyStopping("val_loss", patience=0)
    trainer = _trainer(tmp_path, max_epochs=20, min_steps=9, callbacks=[stopper])

    trainer.fit(_Stalled(), _loader(n=16), _loader(n=8, shuffle=False))

    assert trainer.global_step == 10  # 2 steps an epoch: the 5th epoch's end is past 9


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"min_epochs": 5, "max_epochs": 3}, "min_epochs=5 is above max_epochs=3"),
        ({"min_steps": 50, "max_steps": 10}, "min_steps=50 is above max_steps=10"),
        ({"min_epochs": -1}, "min_epochs"),
        ({"min_steps": 1.5}, "min_steps"),
    ],
)
def test_minimums_that_cannot_hold_are_refused(
    tmp_path: Path, settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        _trainer(tmp_path, **settings)


@pytest.mark.parametrize(
    ("name", "folder"),
    [(None, ""), ("", ""), ("csv/", "csv"), ("runs/a", os.path.join("runs", "a"))],
)
def test_a_file_logger_writes_under_the_experiment_name_as_lightning_joins_it(
    tmp_path: Path, name: str | None, folder: str
) -> None:
    logger = CSVLogger(tmp_path, name=name)
    assert logger.log_dir == os.path.join(tmp_path, folder, "version_0")


@pytest.mark.parametrize("name", ["../elsewhere", "/tmp/abs", 3])
def test_a_file_logger_refuses_a_name_that_leaves_save_dir(tmp_path: Path, name: object) -> None:
    with pytest.raises(ConfigurationError, match="name="):
        CSVLogger(tmp_path, name=name)  # type: ignore[arg-type]


def test_file_loggers_write_on_global_rank_zero_alone_as_lightnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A project's own code calls its loggers on every rank (its hyperparameters,
    # say); only global rank 0 writes, or each rank would make a version of its own.
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("RANK", "1")
    csv_logger = CSVLogger(tmp_path, name="csv")
    board = TensorBoardLogger(tmp_path, name="board")
    for logger in (csv_logger, board):
        logger.log_hyperparams({"lr": 0.1})
        logger.log_metrics({"loss": 1.0}, step=1)
        logger.finalize("success")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("RANK", "0")
    csv_logger.log_hyperparams({"lr": 0.1})
    csv_logger.log_metrics({"loss": 1.0}, step=1)
    written = tmp_path / "csv" / "version_0"
    assert sorted(path.name for path in written.iterdir()) == ["hparams.json", "metrics.csv"]


def test_loggers_put_their_prefix_before_every_metric_name(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    csv_logger = CSVLogger(tmp_path, prefix="fold1")
    board = TensorBoardLogger(tmp_path, name="board", prefix="fold1")
    trainer = _trainer(tmp_path, max_epochs=1, logger=[csv_logger, board], log_every_n_steps=1)

    trainer.fit(Regressor(), _loader(n=16), _loader(n=8, shuffle=False))

    with open(csv_logger.path) as file:
        columns = csv.DictReader(file).fieldnames or []
    assert {"fold1-train_loss_step", "fold1-val_loss"} <= set(columns)
    assert not [c for c in columns if c != "step" and not c.startswith("fold1-")]
    from tensorboard.backend.event_processing.event_accumulator import (  # noqa: PLC0415 (optional)
        EventAccumulator,
    )

    accumulator = EventAccumulator(board.log_dir)
    accumulator.Reload()
    scalars = accumulator.Tags()["scalars"]
    assert "fold1-val_loss" in scalars


class _Graphed(Regressor):
    def __init__(self, lr: float = 0.01) -> None:
        super().__init__(lr=lr)
        self.save_hyperparameters()
        self.example_input_array = torch.zeros(2, 4)
        self.training_at_start: bool | None = None

    @override
    def on_train_start(self) -> None:
        # The graph is traced in eval mode, after set-up: training goes on in train mode.
        self.training_at_start = self.training


def test_tensorboard_logs_the_graph_and_the_hparams_placeholder_as_lightning(
    tmp_path: Path,
) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import (  # noqa: PLC0415 (optional)
        EventAccumulator,
    )

    graphed = TensorBoardLogger(tmp_path, name="graphed", log_graph=True)
    traced = _Graphed()
    _trainer(tmp_path, max_epochs=1, logger=graphed).fit(traced, _loader(n=16))
    assert traced.training_at_start is True
    plain = TensorBoardLogger(tmp_path, name="plain", default_hp_metric=False)
    _trainer(tmp_path, max_epochs=1, logger=plain).fit(_Graphed(), _loader(n=16))

    seen = {}
    for logger in (graphed, plain):
        accumulator = EventAccumulator(logger.log_dir)
        accumulator.Reload()
        seen[logger.name] = accumulator.Tags()
    assert seen["graphed"]["graph"]
    assert "hp_metric" in seen["graphed"]["scalars"]
    assert not seen["plain"]["graph"]
    assert "hp_metric" not in seen["plain"]["scalars"]

    without = TensorBoardLogger(tmp_path, name="without", log_graph=True)
    with pytest.warns(UserWarning, match="has no example_input_array"):
        _trainer(tmp_path, max_epochs=1, logger=without).fit(Regressor(), _loader(n=16))


def test_trainer_model_is_the_module_the_run_trains_as_the_strategy_wrapped_it(
    tmp_path: Path,
) -> None:
    seen: dict[str, object] = {}

    class Looks(Regressor):
        @override
        def configure_optimizers(self) -> object:
            seen["configure_optimizers"] = self.trainer.model
            return super().configure_optimizers()

        @override
        def on_train_start(self) -> None:
            seen["on_train_start"] = self.trainer.model

    model = Looks()
    trainer = _trainer(tmp_path, max_epochs=1)
    assert trainer.model is None
    trainer.fit(model, _loader(n=16))

    # On one device the strategy wraps nothing: the module itself, before and after
    # set-up (DDP's wrapper where DDP wraps it: tests/trainer_job.py).
    assert seen["configure_optimizers"] is model
    assert seen["on_train_start"] is model
    assert trainer.model is None  # the run is over


def test_model_summary_says_the_layers_and_counts_at_fit_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = Regressor()
    model.net[2].weight.requires_grad = False  # 16 of the 97 parameters frozen
    with caplog.at_level(logging.INFO, logger="plait"):
        _trainer(tmp_path, max_epochs=1, callbacks=[ModelSummary(max_depth=2)]).fit(
            model, _loader(n=16)
        )

    said = "\n".join(r.getMessage() for r in caplog.records if "Trainable params" in r.getMessage())
    lines = said.strip().splitlines()
    assert lines[0].split() == ["|", "Name", "|", "Type", "|", "Params", "|", "Mode"]
    assert [line.split(" | ")[1].strip() for line in lines[2:6]] == [
        "net", "net.0", "net.1", "net.2",
    ]  # fmt: skip
    assert [cell.strip() for cell in lines[2].split(" | ")[2:]] == ["Sequential", "97", "train"]
    assert "81       Trainable params" in said
    assert "16       Non-trainable params" in said
    assert "97       Total params" in said


def test_a_rich_model_summary_draws_a_table(tmp_path: Path) -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, color_system=None)
    _trainer(tmp_path, max_epochs=1, callbacks=[RichModelSummary(console=console)]).fit(
        Regressor(), _loader(n=16)
    )

    drawn = out.getvalue()
    assert "Sequential" in drawn
    assert "Total params: 97" in drawn
    # Lightning's Trainer argument adds one; none unless asked.
    assert any(
        isinstance(c, ModelSummary) for c in _trainer(tmp_path, enable_model_summary=True).callbacks
    )
    assert not any(isinstance(c, ModelSummary) for c in _trainer(tmp_path).callbacks)
    with pytest.raises(ConfigurationError, match="max_depth=-2 must be an int of -1 or more"):
        ModelSummary(max_depth=-2)


def test_callback_metrics_answer_item_as_lightnings_tensors_do(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(Regressor(), _loader(n=16), _loader(n=8, shuffle=False))

    metrics = trainer.callback_metrics
    value = metrics["val_loss"].item()  # type: ignore[union-attr]
    assert type(value) is float
    assert value == metrics["val_loss"]
    assert type(metrics["val_seen"].item()) is int  # type: ignore[union-attr]
    assert metrics["val_seen"] == 8
    assert json.loads(json.dumps(metrics))["val_seen"] == 8
    assert pickle.loads(pickle.dumps(metrics)) == metrics
