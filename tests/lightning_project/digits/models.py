"""The classifier: a small dense network, and the module that trains it with torchmetrics."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from torch import nn
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from plait.trainer import Module

Batch = tuple[torch.Tensor, torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


class DenseNet(nn.Module):
    """Flattened pixels through two hidden layers with batch normalisation."""

    def __init__(self, input_size: int = 64, hidden_size: int = 64, output_size: int = 10):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(input_size, hidden_size),
            nn.BatchNorm1d(hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, hidden_size),
            nn.BatchNorm1d(hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, output_size),
        )

    @override
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.layers(images)
        return logits


class DigitsModule(Module):
    """Trains ``net`` to name the digit, with accuracy kept by torchmetrics.

    Args:
        net: The network (made by Hydra from the config's ``net:``).
        optimizer: Makes the optimizer from the parameters (a Hydra partial).
        scheduler: Makes the learning-rate scheduler from the optimizer, or ``None``.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
    ) -> None:
        super().__init__()
        # The network is an argument, and so a hyperparameter; it is not logged.
        self.save_hyperparameters(logger=False)
        self.net = net
        self.criterion = nn.CrossEntropyLoss()
        self.train_acc = MulticlassAccuracy(num_classes=10, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes=10, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=10, average="micro")
        self.train_loss = MeanMetric()
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.val_acc_best = MaxMetric()

    @override
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.net(images)
        return logits

    @override
    def on_train_start(self) -> None:
        # The validation a run may do before training must not count as its best.
        self.val_loss.reset()
        self.val_acc.reset()
        self.val_acc_best.reset()

    def model_step(self, batch: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The loss, the predicted classes and the true ones of a batch."""
        images, labels = cast("Batch", batch)
        logits = self.forward(images)
        loss = self.criterion(logits, labels)
        return loss, logits.argmax(dim=1), labels

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        loss, predictions, labels = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(predictions, labels)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        loss, predictions, labels = self.model_step(batch)
        self.val_loss(loss)
        self.val_acc(predictions, labels)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    @override
    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        # A number, not the metric object: it must not be reset at the epoch's end.
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    @override
    def test_step(self, batch: object, batch_idx: int) -> None:
        loss, predictions, labels = self.model_step(batch)
        self.test_loss(loss)
        self.test_acc(predictions, labels)
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True, prog_bar=True)

    @override
    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.hparams.optimizer(params=self.parameters())
        if self.hparams.scheduler is None:
            return {"optimizer": optimizer}
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": self.hparams.scheduler(optimizer=optimizer),
                "monitor": "val/loss",
                "interval": "epoch",
                "frequency": 1,
            },
        }
