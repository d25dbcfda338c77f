"""Handwritten digits: a small classifier on the 8x8 images that scikit-learn ships.

The data file comes with the scikit-learn distribution
(``pip install 'plait-trainer[examples]'``); it is read directly, without
importing scikit-learn, and nothing is downloaded.
"""

from __future__ import annotations

import gzip
import importlib.metadata
from pathlib import Path
from typing import Final

import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import MissingDependencyError
from plait.trainer.module import DataModule, Module

__all__ = ["DigitsClassifier", "DigitsData", "load_digits"]

_DATA_FILE: Final = "sklearn/datasets/data/digits.csv.gz"
_PIXELS: Final = 64
_CLASSES: Final = 10


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1797 images (as 64 floats in [0, 1]) and their labels.

    Raises:
        MissingDependencyError: scikit-learn, which holds the data file, is not installed.
    """
    try:
        distribution = importlib.metadata.distribution("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        raise MissingDependencyError(
            feature="the digits example", install="plait-trainer[examples]"
        ) from None
    path = Path(str(distribution.locate_file(_DATA_FILE)))
    if not path.is_file():
        raise MissingDependencyError(
            feature=f"the digits example (its data file {_DATA_FILE})",
            install="plait-trainer[examples]",
        )
    with gzip.open(path, "rt") as file:
        rows = [[float(value) for value in line.split(",")] for line in file if line.strip()]
    table = torch.tensor(rows)
    images = table[:, :_PIXELS] / 16.0  # pixel values are counts from 0 to 16
    labels = table[:, _PIXELS].long()
    return images, labels


class DigitsData(DataModule):
    """The digits, split once (by a fixed permutation) into training and validation.

    Args:
        batch_size: Images per batch on each rank.
        val_fraction: The share of images kept for validation.
        split_seed: Seeds the split, the same on every rank and every run.
    """

    def __init__(
        self, batch_size: int = 64, val_fraction: float = 0.2, split_seed: int = 0
    ) -> None:
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self._train: TensorDataset | None = None
        self._val: TensorDataset | None = None

    @override
    def setup(self, stage: str) -> None:
        images, labels = load_digits()
        order = torch.randperm(
            len(labels), generator=torch.Generator().manual_seed(self.split_seed)
        )
        held_out = int(len(labels) * self.val_fraction)
        val, train = order[:held_out], order[held_out:]
        self._train = TensorDataset(images[train], labels[train])
        self._val = TensorDataset(images[val], labels[val])

    @override
    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        assert self._train is not None, "setup() runs first"
        return DataLoader(self._train, batch_size=self.batch_size, shuffle=True)

    @override
    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        assert self._val is not None, "setup() runs first"
        return DataLoader(self._val, batch_size=256)


class DigitsClassifier(Module):
    """A two-layer perceptron over the 64 pixels, trained with AdamW.

    Args:
        hidden: Width of the hidden layer.
        lr: The learning rate.
        dropout: Dropout before the last layer.
    """

    def __init__(self, hidden: int = 128, lr: float = 1e-2, dropout: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()  # DigitsClassifier.load_from_checkpoint makes it again
        self.lr = lr
        self.net = torch.nn.Sequential(
            torch.nn.Linear(_PIXELS, hidden),
            torch.nn.ReLU(),
            torch.nn.Dropout(dropout),
            torch.nn.Linear(hidden, _CLASSES),
        )

    @override
    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy``: split the layers over the mesh, then shard them.

        The hidden layer is split by its outputs and the last by its inputs over
        the tensor-parallel ranks (``mesh["tp"]``), so that only the scores are
        summed between them; then FSDP shards the whole over the data-parallel
        ranks (``mesh["dp_shard"]``). Done once: a later run finds it done.
        """
        mesh = self.device_mesh
        if mesh is None or "tp" not in (mesh.mesh_dim_names or ()):
            return  # no tensor-parallel ranks: FSDP (whose mesh has none) shards it whole
        from plait.strategies.mesh import is_dtensor  # noqa: PLC0415 (only on a mesh)

        if any(is_dtensor(p) for p in self.net.parameters()):
            return
        from torch.distributed.fsdp import fully_shard  # noqa: PLC0415
        from torch.distributed.tensor.parallel import (  # noqa: PLC0415
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        parallelize_module(self.net, mesh["tp"], {"0": ColwiseParallel(), "3": RowwiseParallel()})
        fully_shard(self.net, mesh=mesh["dp_shard"])

    @override
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Class scores of each image."""
        logits = self.net(images)
        assert isinstance(logits, torch.Tensor)
        return logits

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        images, labels = _unpack(batch)
        loss = torch.nn.functional.cross_entropy(self(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        images, labels = _unpack(batch)
        logits = self(images)
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, labels), sync_dist=True)
        correct = (logits.argmax(dim=1) == labels).float().mean()
        self.log("val_acc", correct, prog_bar=True, sync_dist=True)

    @override
    def predict_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        images, _ = _unpack(batch)
        return self.forward(images).argmax(dim=1)

    @override
    def configure_optimizers(self) -> object:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            optimizer, T_max=self.trainer.max_epochs or 10
        )
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def _unpack(batch: object) -> tuple[torch.Tensor, torch.Tensor]:
    assert isinstance(batch, list | tuple), "batches are (images, labels)"
    images: object = batch[0]
    labels: object = batch[1]
    assert isinstance(images, torch.Tensor)
    assert isinstance(labels, torch.Tensor)
    return images, labels
