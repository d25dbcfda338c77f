"""Handwritten-digit-like images made up on the spot: 8x8 pictures of ten classes.

Each class has a picture of its own (drawn once from the seed); a sample is its class's
picture with noise on top. The same seed gives the same samples and the same split,
on every machine and every rank, without a download.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Subset, TensorDataset, random_split
from typing_extensions import override

from plait.trainer import DataModule

NUM_CLASSES = 10
IMAGE_SIZE = 8


def make_digits(num_samples: int, noise: float, seed: int) -> TensorDataset:
    """``num_samples`` images of shape (1, 8, 8) with their labels, from ``seed`` alone."""
    generator = torch.Generator().manual_seed(seed)
    pictures = torch.rand(NUM_CLASSES, 1, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
    labels = torch.randint(NUM_CLASSES, (num_samples,), generator=generator)
    shape = (num_samples, 1, IMAGE_SIZE, IMAGE_SIZE)
    images = pictures[labels] + noise * torch.randn(shape, generator=generator)
    return TensorDataset(images, labels)


class DigitsDataModule(DataModule):
    """The digits, split into training, validation and test sets.

    Args:
        num_samples: How many images in all.
        train_val_test_split: How many of them go to each set (they add up to
            ``num_samples``).
        batch_size: The batch size over all processes; each process loads its share.
        noise: The standard deviation of the noise on each pixel.
        seed: Makes the images and the split.
        num_workers: Loader worker processes.
        pin_memory: Pin the batches' memory (for a GPU).
    """

    def __init__(
        self,
        num_samples: int = 1_000,
        *,
        train_val_test_split: tuple[int, int, int] = (700, 150, 150),
        batch_size: int = 64,
        noise: float = 0.5,
        seed: int = 42,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        if sum(train_val_test_split) != num_samples:
            raise ValueError(
                f"train_val_test_split={list(train_val_test_split)} adds up to "
                f"{sum(train_val_test_split)}, not num_samples={num_samples}"
            )
        self.save_hyperparameters(logger=False)
        self.data_train: Subset[Any] | None = None
        self.data_val: Subset[Any] | None = None
        self.data_test: Subset[Any] | None = None
        self.batch_size_per_device = batch_size

    @property
    def num_classes(self) -> int:
        """How many classes the labels name."""
        return NUM_CLASSES

    @override
    def setup(self, stage: str) -> None:
        """Makes the three sets once, and this process's share of the batch size."""
        if self.trainer is not None:
            world_size = self.trainer.world_size
            if self.hparams.batch_size % world_size != 0:
                raise RuntimeError(
                    f"batch_size={self.hparams.batch_size} does not divide among "
                    f"{world_size} processes"
                )
            self.batch_size_per_device = self.hparams.batch_size // world_size
        if self.data_train is None:
            dataset = make_digits(self.hparams.num_samples, self.hparams.noise, self.hparams.seed)
            self.data_train, self.data_val, self.data_test = random_split(
                dataset,
                list(self.hparams.train_val_test_split),
                generator=torch.Generator().manual_seed(self.hparams.seed),
            )

    def _loader(self, data: Subset[Any] | None, shuffle: bool) -> DataLoader[Any]:
        if data is None:
            raise RuntimeError("setup() makes the data: call it first")
        return DataLoader(
            data,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            shuffle=shuffle,
        )

    @override
    def train_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.data_train, shuffle=True)

    @override
    def val_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.data_val, shuffle=False)

    @override
    def test_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.data_test, shuffle=False)
