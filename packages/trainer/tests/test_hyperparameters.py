"""save_hyperparameters and load_from_checkpoint in one process."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import CheckpointError, ConfigurationError, seed_everything
from plait.trainer import CSVLogger, DataModule, Module, Trainer


def _net(width: int) -> torch.nn.Sequential:
    """The network the test modules train: 2 inputs, ``width`` hidden, 1 output."""
    return torch.nn.Sequential(torch.nn.Linear(2, width), torch.nn.Linear(width, 1))


class Sized(Module):
    """A model whose shape comes from its arguments, saved as hyperparameters."""

    def __init__(self, width: int, lr: float = 0.1, *, act: str = "tanh", **extra: object) -> None:
        super().__init__()
        self.save_hyperparameters(ignore="extra")
        self.net: torch.nn.Module = _net(width)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        (x,) = batch
        loss: torch.Tensor = self.net(x).pow(2).mean()
        return loss

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Other(Sized):
    pass


def _fit(tmp_path: Path, model: Module, **settings: object) -> Trainer:
    options: dict[str, object] = {
        "accelerator": "cpu",
        "default_root_dir": tmp_path,
        "enable_progress_bar": False,
        "logger": False,
        "max_epochs": 2,
        **settings,
    }
    trainer = Trainer(**options)  # type: ignore[arg-type]
    data = DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=4)
    trainer.fit(model, data)
    return trainer


def _last_checkpoint(tmp_path: Path, model: Module, **settings: object) -> str:
    """`_fit`, then the path of the checkpoint the run saved last."""
    callback = _fit(tmp_path, model, **settings).checkpoint_callback
    assert callback is not None
    return callback.last_model_path


def test_the_init_arguments_become_hparams_readable_as_attributes() -> None:
    model = Sized(8, act="relu", note="not saved")

    assert model.hparams == {"width": 8, "lr": 0.1, "act": "relu"}
    assert model.hparams.width == 8
    with pytest.raises(AttributeError, match="no hyperparameter 'depth'; saved: act, lr, width"):
        _ = model.hparams.depth


def test_only_the_named_arguments_are_saved_when_named() -> None:
    class Named(Sized):
        def __init__(self, width: int, lr: float = 0.1) -> None:
            super().__init__(width, lr)
            self.hparams.clear()
            self.save_hyperparameters("width")

    assert Named(4).hparams == {"width": 4}


def test_a_name_that_is_no_argument_is_refused_with_the_arguments() -> None:
    class Misnamed(Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.save_hyperparameters("widht")

    with pytest.raises(ConfigurationError, match="'widht'") as raised:
        Misnamed(3)
    assert raised.value.choices == ("width",)


class WithFactory(Sized):
    """A module given its optimizer factory, as Hydra makes one (``_partial_: true``)."""

    def __init__(self, optimizer: Callable[..., torch.optim.Optimizer], width: int) -> None:
        Module.__init__(self)  # not Sized's: its arguments are not these
        self.save_hyperparameters()
        self.net = _net(width)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        optimizer: torch.optim.Optimizer = self.hparams.optimizer(self.parameters())
        return optimizer


def test_an_object_that_is_not_data_is_kept_in_hparams_and_left_out_of_checkpoints(
    tmp_path: Path,
) -> None:
    factory = functools.partial(torch.optim.SGD, lr=0.1)
    with pytest.warns(UserWarning, match=r"'optimizer' are not plain data \(partial\): kept"):
        model = WithFactory(factory, width=3)
    assert model.hparams.optimizer is factory
    path = _last_checkpoint(tmp_path, model, logger=CSVLogger(tmp_path))
    saved = torch.load(path, weights_only=True)
    assert saved["hyper_parameters"] == {"width": 3}
    logged = json.loads((tmp_path / "plait_logs" / "version_0" / "hparams.json").read_text())
    assert "optimizer" not in json.dumps(logged)
    with pytest.raises(ConfigurationError, match="optimizer"):
        WithFactory.load_from_checkpoint(path)
    with pytest.warns(UserWarning, match="not plain data"):
        loaded = WithFactory.load_from_checkpoint(path, optimizer=factory)
    assert loaded.hparams.width == 3


class Configured(Sized):
    """A module Hydra makes: its list and dict arguments are OmegaConf containers."""

    def __init__(self, sizes: Sequence[int], extra: Mapping[str, object], width: int) -> None:
        Module.__init__(self)  # not Sized's: its arguments are not these
        self.save_hyperparameters()
        self.net = _net(width)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_hydras_lists_and_dicts_are_saved_as_plain_lists_and_dicts(tmp_path: Path) -> None:
    omegaconf = pytest.importorskip("omegaconf")
    config = omegaconf.OmegaConf.create(
        {"width": 3, "sizes": [1, 2], "extra": {"name": "run", "size": "${width}"}}
    )
    model = Configured(sizes=config.sizes, extra=config.extra, width=config.width)
    assert isinstance(model.hparams.sizes, omegaconf.ListConfig)  # as given, in the run
    path = _last_checkpoint(tmp_path, model, logger=CSVLogger(tmp_path))
    saved = torch.load(path, weights_only=True)
    hyperparameters = {"sizes": [1, 2], "extra": {"name": "run", "size": 3}, "width": 3}
    assert saved["hyper_parameters"] == hyperparameters
    loaded = Configured.load_from_checkpoint(path)
    assert loaded.hparams.sizes == [1, 2]


class WithNet(Sized):
    """A module given its network, as Lightning templates write it (``net: nn.Module``).

    Sized's step and optimizer, over the network it is given.
    """

    def __init__(self, net: torch.nn.Module, lr: float = 0.1) -> None:
        Module.__init__(self)  # not Sized's: the network is given
        self.save_hyperparameters(logger=False)
        self.net = net


def test_a_module_argument_is_kept_in_hparams_and_left_out_of_checkpoints(
    tmp_path: Path,
) -> None:
    net = torch.nn.Linear(2, 1)
    with pytest.warns(UserWarning, match=r"'net' are modules: kept in self.hparams"):
        model = WithNet(net, lr=0.05)
    assert model.hparams.net is net
    path = _last_checkpoint(tmp_path, model, logger=CSVLogger(tmp_path))

    saved = torch.load(path, weights_only=True)
    assert saved["hyper_parameters"] == {"lr": 0.05}
    assert not (tmp_path / "plait_logs" / "version_0" / "hparams.json").exists()  # logger=False
    with pytest.warns(UserWarning, match="are modules"):
        loaded = WithNet.load_from_checkpoint(path, net=torch.nn.Linear(2, 1))
    torch.testing.assert_close(loaded.net.weight, net.weight, rtol=0, atol=0)
    with pytest.raises(ConfigurationError, match="net"):
        WithNet.load_from_checkpoint(path)


class Data(DataModule):
    """A data module with hyperparameters, reading its trainer in setup."""

    def __init__(self, batch_size: int = 4, lr: float = 0.1) -> None:
        self.save_hyperparameters()
        self.world_sizes: list[int] = []

    @override
    def setup(self, stage: str) -> None:
        assert self.trainer is not None
        self.world_sizes.append(self.trainer.world_size)

    @override
    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=self.hparams.batch_size)


def test_a_data_module_saves_hyperparameters_and_knows_its_trainer(tmp_path: Path) -> None:
    data = Data(batch_size=8)
    assert data.hparams == {"batch_size": 8, "lr": 0.1}
    logger = CSVLogger(tmp_path)
    trainer = Trainer(
        accelerator="cpu",
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        logger=logger,
        max_epochs=1,
    )

    trainer.fit(Sized(5), datamodule=data)

    assert data.world_sizes == [1]
    assert trainer.global_step == 2  # 16 samples in batches of 8
    logged = json.loads((Path(logger.log_dir) / "hparams.json").read_text())
    assert logged == {"width": 5, "lr": 0.1, "act": "tanh", "batch_size": 8}
    callback = trainer.checkpoint_callback
    assert callback is not None
    saved = torch.load(callback.last_model_path, weights_only=True)
    assert saved["datamodule_hyper_parameters"] == {"batch_size": 8, "lr": 0.1}

    clashing = Trainer(accelerator="cpu", default_root_dir=tmp_path, enable_progress_bar=False)
    with pytest.raises(ConfigurationError, match=r"both save the hyperparameter\(s\) \['lr'\]"):
        clashing.fit(Sized(5, lr=0.5), datamodule=Data())


def test_a_checkpoint_makes_the_module_again_with_its_weights(tmp_path: Path) -> None:
    seed_everything(0)
    model = Sized(6, lr=0.05, act="relu")
    path = _last_checkpoint(tmp_path, model)

    loaded = Sized.load_from_checkpoint(path, map_location="cpu")

    assert isinstance(loaded, Sized)
    assert loaded.hparams == {"width": 6, "lr": 0.05, "act": "relu"}
    assert not loaded.training
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, rtol=0, atol=0)
    # What was not saved, or should differ, is given.
    wider = Sized.load_from_checkpoint(path, lr=1.0, strict=True)
    assert wider.hparams.lr == 1.0


def test_the_loggers_get_the_hyperparameters(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    _fit(tmp_path, Sized(5), logger=logger)

    saved = json.loads((Path(logger.log_dir) / "hparams.json").read_text())
    assert saved == {"width": 5, "lr": 0.1, "act": "tanh"}


def test_loading_another_class_or_without_its_arguments_is_refused(tmp_path: Path) -> None:
    path = _last_checkpoint(tmp_path, Sized(6), max_epochs=1)

    with pytest.raises(ConfigurationError, match=r"is a checkpoint of .*Sized, not of .*Other"):
        Other.load_from_checkpoint(path)

    class Unsaved(Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.net = _net(width)

    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"] = {}
    checkpoint["plait"]["module"] = "tests.Unsaved"
    torch.save(checkpoint, tmp_path / "unsaved.ckpt")
    with pytest.raises(ConfigurationError, match=r"load_from_checkpoint\(path, name=value\)"):
        Unsaved.load_from_checkpoint(tmp_path / "unsaved.ckpt")
    assert Unsaved.load_from_checkpoint(tmp_path / "unsaved.ckpt", width=6).net[0].out_features == 6


def test_a_missing_checkpoint_or_a_bad_map_location_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        Sized.load_from_checkpoint(tmp_path / "none.ckpt")
    torch.save({"plait": {}}, tmp_path / "empty.ckpt")
    with pytest.raises(CheckpointError, match="holds no module state"):
        Sized.load_from_checkpoint(tmp_path / "empty.ckpt")
    with pytest.raises(ConfigurationError, match="map_location='gpu0' is not a device"):
        Sized.load_from_checkpoint(tmp_path / "empty.ckpt", map_location="gpu0")
