"""What existing Lightning code touches: its custom plugins and switches, as Lightning runs them."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import (
    Accelerator,
    ClusterEnvironment,
    ConfigurationError,
    MethodAccelerator,
    MethodEnvironment,
)
from plait.environments import LocalEnvironment
from plait.precision import MixedPrecision
from plait.strategies import DDPStrategy, ModelParallelStrategy
from plait.strategies.base import BaseStrategy
from plait.trainer import ModelCheckpoint, Module, Trainer, connect
from plait.trainer.layer_sync import TorchSyncBatchNorm
from plait.trainer.torch_flags import CUBLAS_WORKSPACE, TorchFlags

# Parts written as Lightning's documentation writes them, with only the imports changed.


def environment_part(part: object) -> ClusterEnvironment:
    """``part`` where plait's typed API takes an environment: plait adapts it."""
    return cast("ClusterEnvironment", part)


def accelerator_part(part: object) -> Accelerator:
    """``part`` where plait's typed API takes an accelerator: plait adapts it."""
    return cast("Accelerator", part)


class LightningStyleCluster:
    """A cluster environment whose place is given by methods, as Lightning's are.

    Lightning's subclass its ``ClusterEnvironment`` base class; plait has a Protocol
    there, which these methods do not meet as types: they are passed with a cast.
    """

    def __init__(self, *, external: bool = True) -> None:
        self.external = external
        self.placed: list[tuple[str, int]] = []

    @property
    def creates_processes_externally(self) -> bool:
        return self.external

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "12910"))

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))

    def set_world_size(self, size: int) -> None:
        self.placed.append(("world_size", size))

    def global_rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    def set_global_rank(self, rank: int) -> None:
        self.placed.append(("global_rank", rank))

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def node_rank(self) -> int:
        return int(os.environ.get("NODE_RANK", "0"))


class LightningStyleAccelerator:
    """An accelerator with Lightning's static methods: counts in, lists out, no name."""

    def setup_device(self, device: torch.device) -> None:
        pass

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: object) -> int:
        return int(str(devices))

    @staticmethod
    def get_parallel_devices(devices: int) -> list[torch.device]:
        return [torch.device("cpu")] * devices

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return True


@pytest.fixture
def torchrun_rank_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables of rank 1 of 2 that a launcher started."""
    for name, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "23456",
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "1",
    }.items():
        monkeypatch.setenv(name, value)


def test_an_environment_with_lightnings_methods_is_read_through_plaits_properties(
    torchrun_rank_1: None,
) -> None:
    cluster = LightningStyleCluster()

    connection = connect(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        plugins=[environment_part(cluster)],
    )

    strategy = connection.strategy
    assert isinstance(strategy, DDPStrategy)
    assert isinstance(strategy.cluster_environment, MethodEnvironment)
    assert strategy.cluster_environment.environment is cluster
    assert (strategy.world_size, strategy.global_rank, strategy.local_rank) == (2, 1, 1)
    assert strategy.cluster_environment.main_port == 23456
    assert connection.devices == (0, 1)


def test_an_environment_plait_starts_processes_for_is_told_its_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As Lightning's strategies call set_world_size and set_global_rank: in the
    # launching process (rank 0 of 1 until it launches), then in a rank it started.
    cluster = LightningStyleCluster(external=False)
    DDPStrategy(accelerator="cpu", cluster_environment=environment_part(cluster))
    assert cluster.placed == [("world_size", 1), ("global_rank", 0)]

    for name, value in {"WORLD_SIZE": "3", "RANK": "2", "LOCAL_RANK": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", "23456")
    cluster.placed.clear()
    three = [torch.device("cpu")] * 3
    environment = environment_part(cluster)
    DDPStrategy(accelerator="cpu", cluster_environment=environment, parallel_devices=three)
    assert cluster.placed == [("world_size", 3), ("global_rank", 2)]


def test_an_environment_method_that_gives_no_int_is_named() -> None:
    class Broken(LightningStyleCluster):
        @override
        def world_size(self) -> int:
            return "two"  # type: ignore[return-value]  # the mistake the test makes

    with pytest.raises(ConfigurationError, match=r"Broken's world_size gave 'two', not an int"):
        DDPStrategy(accelerator="cpu", cluster_environment=environment_part(Broken()))


def test_an_accelerator_with_lightnings_static_methods_gives_plait_its_devices() -> None:
    accelerator = accelerator_part(LightningStyleAccelerator())

    connection = connect(accelerator=accelerator, strategy="ddp", devices=2)

    assert connection.devices == (0, 1)
    strategy = connection.strategy
    assert isinstance(strategy.accelerator, MethodAccelerator)
    assert strategy.accelerator.accelerator is accelerator
    assert strategy.accelerator.name == "lightning_style"
    assert strategy.root_device == torch.device("cpu")
    # The same object given to the strategy and to the Trainer is one accelerator.
    given = DDPStrategy(accelerator=accelerator)
    assert connect(accelerator=accelerator, strategy=given, devices=2).devices == (0, 1)


def test_an_accelerator_whose_parse_devices_gives_nonsense_is_named() -> None:
    class Broken(LightningStyleAccelerator):
        @staticmethod
        @override
        def parse_devices(devices: object) -> int:
            return {"devices": devices}  # type: ignore[return-value]  # the mistake

    with pytest.raises(ConfigurationError, match=r"Broken's parse_devices gave \{'devices': 2\}"):
        connect(accelerator=accelerator_part(Broken()), strategy="ddp", devices=2)


def test_a_subclass_overriding_a_field_with_a_property_is_built() -> None:
    class FixedPort(LocalEnvironment):
        @property
        @override
        def main_port(self) -> int:
            return 12910

    environment = FixedPort.from_environ({"MASTER_PORT": "23456"})

    assert environment.main_port == 12910
    assert environment.world_size == 1
    strategy = DDPStrategy(accelerator="cpu", cluster_environment=environment)
    assert strategy.cluster_environment.main_port == 12910


# torch's switches.


@pytest.fixture
def torch_switches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch's global switches and CUBLAS_WORKSPACE_CONFIG, put back after the test."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    yield
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    torch.backends.cudnn.benchmark = benchmark


class Tiny(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _quiet(tmp_path: Path, **settings: object) -> Trainer:
    """A trainer for one epoch on the CPU that writes nothing."""
    options: dict[str, object] = {
        "accelerator": "cpu",
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "default_root_dir": tmp_path,
        **settings,
    }
    return Trainer(**options)  # type: ignore[arg-type]


def _fit(tmp_path: Path, **settings: object) -> None:
    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    _quiet(tmp_path, **settings).fit(Tiny(), DataLoader(data, batch_size=4))


@pytest.mark.usefixtures("torch_switches")
def test_deterministic_warn_warns_instead_of_raising_and_sets_cublas_workspace(
    tmp_path: Path,
) -> None:
    _fit(tmp_path, deterministic="warn")

    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert torch.backends.cudnn.benchmark is False  # a deterministic run leaves it off


@pytest.mark.usefixtures("torch_switches")
def test_deterministic_true_raises_on_nondeterminism_and_keeps_a_workspace_already_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")

    _fit(tmp_path, deterministic=True)

    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


@pytest.mark.usefixtures("torch_switches")
def test_benchmark_is_set_for_the_run_and_left_alone_by_default(tmp_path: Path) -> None:
    _fit(tmp_path, benchmark=True)
    assert torch.backends.cudnn.benchmark is True

    _fit(tmp_path)
    assert torch.backends.cudnn.benchmark is True  # None: left as it was

    with pytest.warns(UserWarning, match="deterministic and benchmark=True"):
        TorchFlags.resolve(deterministic=True, benchmark=True, sync_batchnorm=False)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"deterministic": "yes"}, "deterministic"),
        ({"benchmark": "on"}, "benchmark"),
        ({"sync_batchnorm": 1}, "sync_batchnorm"),
    ],
)
def test_a_switch_out_of_its_choices_is_refused(settings: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Trainer(accelerator="cpu", logger=False, **settings)  # type: ignore[arg-type]


def test_sync_batchnorm_on_the_cpu_with_several_processes_is_refused() -> None:
    with pytest.raises(
        ConfigurationError, match="SyncBatchNorm synchronises only on cuda"
    ) as caught:
        Trainer(accelerator="cpu", strategy="ddp", devices=2, sync_batchnorm=True, logger=False)
    assert caught.value.fix is not None


def test_sync_batchnorm_turns_every_batch_norm_into_a_sync_one_on_several_processes() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    weight = module[1].weight
    flags = TorchFlags(sync_batchnorm=True)

    assert flags.prepare(module, processes=1) is module
    assert type(module[1]).__name__ == "BatchNorm1d"
    assert flags.prepare(module, processes=2) is module
    assert type(module[1]).__name__ == "SyncBatchNorm"
    assert module[1].weight is weight  # the optimizers' parameters stay


def test_torch_sync_batch_norm_reverts_to_batch_norms_holding_the_same_state() -> None:
    module = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 1),
        torch.nn.BatchNorm2d(2),
        torch.nn.Flatten(),
        torch.nn.BatchNorm1d(8),
    )
    module(torch.randn(4, 1, 2, 2))  # running statistics to keep
    before = {key: value.clone() for key, value in module.state_dict().items()}
    weight = module[1].weight
    sync = TorchSyncBatchNorm()

    assert sync.apply(module) is module
    assert [type(layer).__name__ for layer in module][1::2] == ["SyncBatchNorm"] * 2
    assert sync.revert(module) is module

    assert not any(isinstance(layer, torch.nn.SyncBatchNorm) for layer in module.modules())
    assert module[1].weight is weight  # the optimizers' parameters stay
    assert module.state_dict().keys() == before.keys()
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key]), key
    module(torch.randn(4, 1, 2, 2))  # trains in one process again
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        module[3](torch.randn(8))


class _Marking:
    """A layer sync of a user's: notes the layers it synchronised, and forgets them."""

    def __init__(self, *, replace: bool = False) -> None:
        self.replace = replace
        self.synced: set[int] = set()

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        self.synced |= {id(layer) for layer in model.modules()}
        return torch.nn.Sequential(model) if self.replace else model

    def revert(self, model: torch.nn.Module) -> torch.nn.Module:
        self.synced -= {id(layer) for layer in model.modules()}
        return model


def test_a_layer_sync_plugin_of_a_users_is_applied_on_several_processes_and_reverted() -> None:
    layer_sync = _Marking()
    trainer = Trainer(accelerator="cpu", devices=2, plugins=[layer_sync], logger=False)
    flags = trainer.torch_flags
    module = torch.nn.Sequential(torch.nn.Linear(2, 2))

    assert flags.layer_sync is layer_sync
    assert flags.prepare(module, processes=1) is module
    assert not layer_sync.synced  # one process: nothing to synchronise
    assert flags.prepare(module, processes=2) is module
    assert id(module[0]) in layer_sync.synced
    flags.revert(module, processes=2)
    assert not layer_sync.synced
    with pytest.raises(ConfigurationError, match=r"_Marking\.apply returned another module"):
        TorchFlags(layer_sync=_Marking(replace=True)).prepare(module, processes=2)


def test_torch_sync_batch_norm_as_a_plugin_is_sync_batchnorm() -> None:
    # On the CPU torch cannot synchronise batch norms: refused, as sync_batchnorm=True is.
    with pytest.raises(ConfigurationError, match=r"TorchSyncBatchNorm\) on cpu"):
        Trainer(accelerator="cpu", devices=2, plugins=[TorchSyncBatchNorm()], logger=False)
    with pytest.raises(ConfigurationError, match="were both given"):
        Trainer(accelerator="cpu", sync_batchnorm=True, plugins=[TorchSyncBatchNorm()])
    one = Trainer(accelerator="cpu", devices=1, plugins=[TorchSyncBatchNorm()], logger=False)
    assert one.torch_flags.sync_batchnorm
    assert isinstance(one.torch_flags.layer_sync, TorchSyncBatchNorm)


# Precision.


def test_16_mixed_by_name_on_the_cpu_is_bf16_mixed_with_a_warning_as_in_lightning() -> None:
    with pytest.warns(UserWarning, match="'bf16-mixed' is used instead"):
        trainer = Trainer(accelerator="cpu", precision="16-mixed", logger=False)

    precision = trainer.strategy.precision
    assert precision.compute_dtype == torch.bfloat16
    assert not precision.needs_scaler
    assert any("bf16-mixed" in line for line in trainer.reasons)


@pytest.mark.parametrize("by", ["name", "instance"])
def test_16_mixed_on_model_parallel_is_refused_on_the_cpu_too_as_in_lightning(by: str) -> None:
    # Not trained in bf16 instead: the strategy refuses a gradient scaler everywhere.
    strategy = "model_parallel" if by == "name" else ModelParallelStrategy()
    with pytest.raises(ConfigurationError, match=r"float16 mixed precision is not supported"):
        Trainer(accelerator="cpu", strategy=strategy, precision="16-mixed", logger=False)


def test_16_mixed_given_as_a_plugin_on_the_cpu_stays_float16() -> None:
    fp16 = MixedPrecision("16-mixed", device_type="cpu")

    trainer = Trainer(accelerator="cpu", plugins=[fp16], logger=False)

    assert trainer.strategy.precision is fp16
    assert trainer.strategy.precision.compute_dtype == torch.float16


# Data a module defines itself.


class OwnData(Tiny):
    """A Lightning module with its own data: hooks and loader methods."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.data: TensorDataset | None = None

    @override
    def prepare_data(self) -> None:
        self.calls.append("prepare_data")

    @override
    def setup(self, stage: str) -> None:
        self.calls.append(f"setup {stage}")
        self.data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))

    @override
    def teardown(self, stage: str) -> None:
        self.calls.append(f"teardown {stage}")

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        assert self.data is not None, "setup runs before the loaders are asked for"
        self.calls.append("train_dataloader")
        return DataLoader(self.data, batch_size=4)

    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        assert self.data is not None
        self.calls.append("val_dataloader")
        return DataLoader(self.data, batch_size=4)

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        assert isinstance(batch, list)
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))


def test_fit_reads_the_loaders_a_module_defines_after_its_own_setup(tmp_path: Path) -> None:
    model = OwnData()
    trainer = _quiet(tmp_path)

    trainer.fit(model)

    assert model.calls[:2] == ["prepare_data", "setup fit"]
    assert {"train_dataloader", "val_dataloader"} <= set(model.calls)
    assert model.calls[-1] == "teardown fit"
    assert trainer.global_step == 2  # 8 samples in batches of 4
    assert "val_loss" in trainer.callback_metrics

    [metrics] = trainer.validate(model)
    assert "val_loss" in metrics
    assert model.calls[-1] == "teardown validate"
    with pytest.raises(ConfigurationError, match="predict has no data: no loader was given"):
        trainer.predict(model)  # no predict_dataloader: still no data


def test_fit_with_training_loaders_validates_with_the_modules_own_loader(
    tmp_path: Path,
) -> None:
    model = OwnData()
    trainer = _quiet(tmp_path)
    given = DataLoader(TensorDataset(torch.randn(12, 2), torch.randn(12, 1)), batch_size=4)

    trainer.fit(model, given)

    assert trainer.global_step == 3  # the given loader's 12 samples, not the module's 8
    assert model.calls.count("val_dataloader") == 1
    assert "train_dataloader" not in model.calls
    assert "val_loss" in trainer.callback_metrics
    assert model.calls[:2] == ["prepare_data", "setup fit"]


def test_the_trainer_answers_lightnings_questions_about_its_parts() -> None:
    trainer = Trainer(
        accelerator="cpu", strategy="ddp", devices=3, precision="bf16-mixed", logger=False
    )

    assert trainer.accelerator is trainer.strategy.accelerator
    assert trainer.precision_plugin is trainer.strategy.precision
    assert trainer.precision == "bf16-mixed"
    assert (trainer.num_devices, trainer.num_nodes, trainer.device_ids) == (3, 1, [0, 1, 2])


def test_model_checkpoint_monitoring_the_step_keeps_the_newest_k(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(tmp_path / "ckpt", monitor="step", mode="max", save_top_k=2)

    _fit(tmp_path, max_epochs=3, callbacks=[checkpoint], enable_checkpointing=True)

    assert sorted(checkpoint.best_k_models.values()) == [4.0, 6.0]  # 2 steps an epoch
    assert checkpoint.best_model_score == 6.0
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "epoch=1-step=4.ckpt",
        "epoch=2-step=6.ckpt",
        "last.ckpt",
    ]


def test_an_interactive_session_gets_ddp_notebook_and_is_told_why_ddp_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)  # as a REPL or notebook has it

    trainer = Trainer(accelerator="cpu", devices=2, logger=False)

    strategy = trainer.strategy
    assert isinstance(strategy, DDPStrategy)
    assert strategy.start_method == "fork"
    assert any("interactive session" in line for line in trainer.reasons)
    for name in ("ddp", "ddp_spawn"):
        with pytest.raises(ConfigurationError, match="has no program file to run") as caught:
            Trainer(accelerator="cpu", strategy=name, devices=2, logger=False)
        assert caught.value.fix is not None
        assert "strategy='ddp_notebook'" in caught.value.fix
    # One process starts nothing: any strategy will do.
    assert Trainer(accelerator="cpu", strategy="ddp", devices=1, logger=False).num_processes == 1


def test_gradient_clip_val_zero_means_no_clipping_as_in_lightning(tmp_path: Path) -> None:
    trainer = Trainer(accelerator="cpu", gradient_clip_val=0, logger=False)

    assert trainer.gradient_clip_val is None
    with pytest.raises(ConfigurationError, match="gradient_clip_val=-1"):
        Trainer(accelerator="cpu", gradient_clip_val=-1, logger=False)


class _RankZeroOnly:
    """A stand-in for lightning_utilities' ``rank_zero_only``: it keeps a ``rank``."""

    rank: int | None = None


def test_a_trainer_and_its_strategy_set_lightning_utilities_rank_as_lightning_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torchmetrics and many projects' loggers call lightning_utilities' rank_zero_only,
    # which raises until its rank is set.
    module = types.ModuleType("lightning_utilities.core.rank_zero")
    switch = _RankZeroOnly()
    module.rank_zero_only = switch  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)

    Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    assert switch.rank == 0
    # A rank's strategy says its own rank as it sets its process up (the part of
    # set-up every strategy runs, before a parallel one joins its group).
    monkeypatch.setattr(DDPStrategy, "global_rank", property(lambda self: 1))
    BaseStrategy.setup_environment(DDPStrategy(accelerator="cpu"))
    assert switch.rank == 1
