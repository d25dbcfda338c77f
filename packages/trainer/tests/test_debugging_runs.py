"""Debugging runs: fast_dev_run, overfit_batches, num_sanity_val_steps, detect_anomaly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import seed_everything
from plait.trainer import ModelCheckpoint, Module, Trainer


def _loader(n: int = 24, shuffle: bool = False) -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4, shuffle=shuffle)


class Recorder(Module):
    """Records which samples each step saw, and in which order the steps ran."""

    def __init__(self, nan: bool = False) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.2))
        self.head = torch.nn.Linear(8, 1)
        self.nan = nan
        self.calls: list[str] = []
        self.seen: list[list[float]] = []
        self.losses: list[float] = []

    def _loss(self, batch: object) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        out = self.head(self.net(x))
        if self.nan:  # the gradient of sqrt at 0, times 0: NaN in the backward pass
            out = out + (out * 0).sqrt()
        return torch.nn.functional.mse_loss(out, y)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        self.calls.append("train")
        self.seen.append(batch[0][:, 0].tolist())
        loss = self._loss(batch)
        self.losses.append(loss.item())
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        assert isinstance(batch, list)
        self.calls.append("validate")
        self.log("val_seen", len(batch[0]), reduce_fx="sum")

    @override
    def test_step(self, batch: object, batch_idx: int) -> None:
        self.calls.append("test")

    @override
    def predict_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        self.calls.append("predict")
        out: torch.Tensor = self.head(self.net(batch[0]))
        return out

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(tmp_path: Path, **settings: object) -> Trainer:
    options: dict[str, object] = {
        "accelerator": "cpu",
        "default_root_dir": tmp_path,
        "enable_progress_bar": False,
        "max_epochs": 2,
        **settings,
    }
    return Trainer(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fast_dev_run", "batches"), [(True, 1), (3, 3)])
def test_fast_dev_run_runs_n_batches_of_each_stage_and_writes_nothing(
    tmp_path: Path, fast_dev_run: bool | int, batches: int
) -> None:
    root = tmp_path / "run"
    model = Recorder()
    # A logger by default and a checkpoint callback of the user's: neither writes.
    trainer = _trainer(root, fast_dev_run=fast_dev_run, max_epochs=5, logger=True)
    trainer.fit(model, _loader(), _loader())
    trainer.validate(model, _loader())
    trainer.test(model, _loader())
    predictions = trainer.predict(model, _loader())

    fit = ["train"] * batches + ["validate"] * batches
    assert model.calls == [
        *fit,
        *(["validate"] * batches),
        *(["test"] * batches),
        *(["predict"] * batches),
    ]
    assert len(predictions) == batches
    assert (trainer.current_epoch, trainer.global_step) == (1, batches)
    assert trainer.fast_dev_run == batches
    assert not root.exists() or not any(root.rglob("*"))


def test_a_checkpoint_callback_saves_nothing_in_a_fast_dev_run(tmp_path: Path) -> None:
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "checkpoints")
    trainer = _trainer(tmp_path, fast_dev_run=True, callbacks=[checkpoints])

    trainer.fit(Recorder(), _loader())

    assert not (tmp_path / "checkpoints").exists()
    assert checkpoints.last_model_path == ""


def test_overfit_batches_trains_on_the_same_first_batches_in_order(tmp_path: Path) -> None:
    model = Recorder()
    trainer = _trainer(tmp_path, overfit_batches=2, max_epochs=3, logger=False)

    trainer.fit(model, _loader(shuffle=True), _loader())

    first_epoch = model.seen[:2]
    assert model.seen == first_epoch * 3
    assert first_epoch == [batch[0][:, 0].tolist() for batch in list(_loader())[:2]]
    assert trainer.callback_metrics["val_seen"] == 8  # validation: 2 batches as well


def test_a_sanity_check_validates_first_and_counts_nothing(tmp_path: Path) -> None:
    seed_everything(0)
    plain = Recorder()
    _trainer(tmp_path / "plain", logger=False, enable_checkpointing=False).fit(
        plain, _loader(shuffle=True), _loader()
    )
    seed_everything(0)
    checked = Recorder()
    trainer = _trainer(
        tmp_path / "checked", logger=False, enable_checkpointing=False, num_sanity_val_steps=2
    )
    sanity: list[bool] = []
    original = checked.validation_step

    def validation_step(batch: object, batch_idx: int) -> None:
        sanity.append(trainer.sanity_checking)
        original(batch, batch_idx)

    checked.validation_step = validation_step  # type: ignore[method-assign]
    trainer.fit(checked, _loader(shuffle=True), _loader())

    assert checked.calls[:3] == ["validate", "validate", "train"]
    assert sanity[:2] == [True, True]
    assert not any(sanity[2:])
    assert trainer.callback_metrics["val_seen"] == 24  # the sanity batches counted nowhere
    # Training drew the same dropout masks and shuffles as without the check.
    assert checked.losses == plain.losses


def test_a_sanity_check_of_every_batch(tmp_path: Path) -> None:
    model = Recorder()
    _trainer(tmp_path, logger=False, num_sanity_val_steps=-1, max_epochs=1).fit(
        model, _loader(), _loader(n=12)
    )
    assert model.calls[:4] == ["validate", "validate", "validate", "train"]


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_detect_anomaly_names_the_operation_that_made_nan(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"Function '\w+Backward0' returned nan values"):
        _trainer(tmp_path, logger=False, detect_anomaly=True).fit(Recorder(nan=True), _loader())

    # Without it, the NaN goes unnoticed into the weights.
    model = Recorder(nan=True)
    _trainer(tmp_path, logger=False, max_epochs=1).fit(model, _loader())
    assert torch.isnan(model.head.weight).all()
