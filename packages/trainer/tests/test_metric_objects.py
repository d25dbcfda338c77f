"""torchmetrics objects logged with ``self.log``, as Lightning code logs them.

The two-rank case (a repeated evaluation batch counted once, the metric's own sync)
is in ``tests/test_trainer_distributed.py`` (the ``uneven`` scenario).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import ConfigurationError
from plait.trainer import CSVLogger, Module, Trainer

CLASSES = 3


def _batches(seed: int, count: int = 12) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(count, 4, generator=generator),
        torch.randint(0, CLASSES, (count,), generator=generator),
    )


class Classifier(Module):
    """Accuracy logged as a torchmetrics object: per step and per epoch in training,
    per epoch in validation; every prediction kept, to check against by hand."""

    def __init__(self, *, update_only: bool = False) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, CLASSES)
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(
            num_classes=CLASSES, average="micro"
        )
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(
            num_classes=CLASSES, average="micro"
        )
        self.update_only = update_only
        self.step_values: list[float] = []
        self.train_hits: list[list[bool]] = []
        self.val_hits: list[list[bool]] = []

    def _hits(self, batch: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert isinstance(batch, list)
        x, y = batch
        logits = self.layer(x)
        return logits, y, logits.argmax(dim=1) == y

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        logits, y, hits = self._hits(batch)
        if batch_idx == 0:
            self.train_hits.append([])
        self.train_hits[-1].extend(hits.tolist())
        if self.update_only:
            self.train_acc.update(logits, y)
        else:
            self.train_acc(logits, y)
            self.step_values.append(float(hits.float().mean()))
        self.log("train/acc", self.train_acc, on_step=True, on_epoch=True)
        return torch.nn.functional.cross_entropy(logits, y)

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        logits, y, hits = self._hits(batch)
        if batch_idx == 0:
            self.val_hits.append([])
        self.val_hits[-1].extend(hits.tolist())
        self.val_acc.update(logits, y)
        self.log("val/acc", self.val_acc, prog_bar=True)

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def _trainer(tmp_path: Path, **settings: object) -> Trainer:
    options: dict[str, object] = {
        "accelerator": "cpu",
        "max_epochs": 2,
        "logger": CSVLogger(tmp_path, name="logs"),
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "default_root_dir": tmp_path,
        "log_every_n_steps": 1,
        **settings,
    }
    return Trainer(**options)  # type: ignore[arg-type]


def _mean(hits: list[bool]) -> float:
    return sum(hits) / len(hits)


def test_a_metric_object_gives_its_batch_value_per_step_and_its_compute_per_epoch(
    tmp_path: Path,
) -> None:
    model = Classifier()
    trainer = _trainer(tmp_path)

    trainer.fit(
        model,
        DataLoader(_batches(0), batch_size=4),
        DataLoader(_batches(1, count=10), batch_size=4),
    )

    # Each epoch's value is its own batches' alone: the metrics were reset between.
    assert trainer.callback_metrics["train/acc_epoch"] == pytest.approx(_mean(model.train_hits[1]))
    assert trainer.callback_metrics["val/acc"] == pytest.approx(_mean(model.val_hits[-1]))
    assert trainer.callback_metrics["train/acc_step"] == pytest.approx(model.step_values[-1])
    assert trainer.progress_bar_metrics["val/acc"] == trainer.callback_metrics["val/acc"]
    rows = (Path(trainer.log_dir or "") / CSVLogger.FILE_NAME).read_text().splitlines()
    header = rows[0].split(",")
    steps = [row.split(",")[header.index("train/acc_step")] for row in rows[1:]]
    logged = [float(value) for value in steps if value]
    assert logged == pytest.approx(model.step_values)  # every step's batch value
    # After the run the objects are empty again, ready for the next one.
    assert model.val_acc.update_count == 0
    assert model.train_acc.update_count == 0


def test_validate_computes_and_resets_a_metric_object_each_run(tmp_path: Path) -> None:
    model = Classifier()
    trainer = _trainer(tmp_path, logger=False)
    loader = DataLoader(_batches(2, count=9), batch_size=4)

    [first] = trainer.validate(model, loader)
    [second] = trainer.validate(model, loader)

    assert first["val/acc"] == pytest.approx(_mean(model.val_hits[0]))
    assert second == first  # the second run counted its own batches only


def test_a_metric_object_updated_but_never_called_cannot_give_a_step_value(
    tmp_path: Path,
) -> None:
    trainer = _trainer(tmp_path, logger=False, max_epochs=1)

    with pytest.raises(ConfigurationError, match=r"updated \(metric\.update\(\.\.\.\)\)") as caught:
        trainer.fit(Classifier(update_only=True), DataLoader(_batches(0), batch_size=4))
    assert caught.value.fix is not None
    assert "on_step=False" in caught.value.fix
