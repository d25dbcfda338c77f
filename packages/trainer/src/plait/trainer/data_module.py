"""A run's data apart from the model (`DataModule`), or held by the module (`ModuleData`).

Both as Lightning has them: a data module's loaders and its ``prepare_data`` and
``setup`` hooks, or the same loader methods defined on the module itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from typing_extensions import override

from plait.trainer.hparams import SavesHyperParameters

if TYPE_CHECKING:
    from collections.abc import Iterable

    from plait.trainer.module import Module
    from plait.trainer.trainer import Trainer

__all__ = ["LOADER_METHODS", "DataModule", "ModuleData", "defines"]


class DataModule(SavesHyperParameters):
    """The data of a run, kept apart from the model: override the loaders you have.

    ``setup(stage)`` runs on every rank before the loaders are asked for, with
    ``stage`` one of ``"fit"``, ``"validate"``, ``"test"``, ``"predict"``;
    ``prepare_data()`` runs once per job, on global rank 0, before it (download
    there, never in ``setup``). ``self.trainer`` is the trainer of the running run
    (``self.trainer.world_size`` in ``setup``), ``None`` outside one.
    """

    trainer: Trainer | None = None
    """The trainer of the running run, set before ``prepare_data`` and ``setup``."""

    def prepare_data(self) -> None:
        """Fetch or write data once per job (rank 0 only)."""

    def setup(self, stage: str) -> None:
        """Build the datasets for ``stage`` (on every rank)."""

    def train_dataloader(self) -> Iterable[object]:
        """The training loader."""
        raise NotImplementedError(f"{type(self).__name__} has no train_dataloader()")

    def val_dataloader(self) -> Iterable[object]:
        """The validation loader."""
        raise NotImplementedError(f"{type(self).__name__} has no val_dataloader()")

    def test_dataloader(self) -> Iterable[object]:
        """The test loader."""
        raise NotImplementedError(f"{type(self).__name__} has no test_dataloader()")

    def predict_dataloader(self) -> Iterable[object]:
        """The prediction loader."""
        raise NotImplementedError(f"{type(self).__name__} has no predict_dataloader()")

    def has(self, stage_loader: str) -> bool:
        """Whether this data module overrides the loader method ``stage_loader``."""
        return getattr(type(self), stage_loader) is not getattr(DataModule, stage_loader)


LOADER_METHODS: Final = (
    "train_dataloader",
    "val_dataloader",
    "test_dataloader",
    "predict_dataloader",
)
"""The loader methods a `DataModule`, or a module that holds its own data, defines."""


def defines(module: Module, method: str) -> bool:
    """Whether ``module``'s class defines ``method`` (a hook Lightning modules may have)."""
    return callable(getattr(type(module), method, None))


class ModuleData(DataModule):
    """The data a module defines itself, as Lightning modules may: its loader methods.

    ``trainer.fit(model)`` with neither loaders nor a data module reads the model's
    ``train_dataloader()`` (and ``val_dataloader()``), and ``trainer.fit(model,
    train_loader)`` its ``val_dataloader()``; the module's own ``prepare_data`` and
    ``setup`` run as its hooks, whatever supplies the data.

    Args:
        module: The module with ``*_dataloader`` methods.
    """

    def __init__(self, module: Module) -> None:
        self.module = module

    @override
    def has(self, stage_loader: str) -> bool:
        return defines(self.module, stage_loader)

    def _loader(self, method: str) -> Iterable[object]:
        loader: Iterable[object] = getattr(self.module, method)()
        return loader

    @override
    def train_dataloader(self) -> Iterable[object]:
        return self._loader("train_dataloader")

    @override
    def val_dataloader(self) -> Iterable[object]:
        return self._loader("val_dataloader")

    @override
    def test_dataloader(self) -> Iterable[object]:
        return self._loader("test_dataloader")

    @override
    def predict_dataloader(self) -> Iterable[object]:
        return self._loader("predict_dataloader")
