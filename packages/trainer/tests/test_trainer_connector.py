"""The connector: every seed of the issue works as written, and bad combinations fail early."""

from __future__ import annotations

import logging
import shutil
import sys
import warnings
from collections.abc import Iterator

import pytest
import torch

from plait.accelerators import CPUAccelerator
from plait.core import (
    ConfigurationError,
    PrecisionRegistry,
    StrategyRegistry,
)
from plait.environments import LightningEnvironment, LocalEnvironment
from plait.precision import TruePrecision
from plait.strategies import DDPStrategy, SingleDeviceStrategy
from plait.trainer import Trainer, connect


class CustomDDPStrategy(DDPStrategy):
    """A user's DDP strategy, as the seeds show it: built with no arguments."""


class CustomPrecision(TruePrecision):
    """A user's precision plugin."""


class CustomAccelerator(CPUAccelerator):
    """A user's accelerator: the CPU under another class."""


def test_a_ddp_name_with_three_cpu_devices_makes_three_processes() -> None:
    trainer = Trainer(strategy="ddp", accelerator="cpu", devices=3, logger=False)

    strategy = trainer.strategy
    assert isinstance(strategy, DDPStrategy)
    assert strategy.start_method == "popen"
    assert strategy.num_processes == 3
    assert trainer.num_processes == 3
    assert any("strategy 'ddp': by name" in line for line in trainer.reasons)


def test_a_ddp_instance_keeps_its_arguments_and_gets_the_devices() -> None:
    given = DDPStrategy(static_graph=True)

    trainer = Trainer(strategy=given, accelerator="cpu", devices=2, logger=False)

    strategy = trainer.strategy
    assert isinstance(strategy, DDPStrategy)
    assert strategy is not given  # made again, not changed
    assert strategy.ddp_kwargs == {"static_graph": True}
    assert strategy.num_processes == 2
    assert given.num_processes == 1


def test_ddp_spawn_with_auto_accelerator_and_four_devices() -> None:
    trainer = Trainer(strategy="ddp_spawn", accelerator="auto", devices=4, logger=False)

    strategy = trainer.strategy
    assert isinstance(strategy, DDPStrategy)
    assert strategy.start_method == "spawn"
    assert strategy.num_processes == 4


def test_a_custom_strategy_takes_a_custom_precision_plugin() -> None:
    precision = CustomPrecision()

    trainer = Trainer(strategy=CustomDDPStrategy(), plugins=[precision], logger=False)

    assert type(trainer.strategy) is CustomDDPStrategy
    assert trainer.strategy.precision is precision


def test_a_strategy_built_with_its_own_accelerator_and_precision_is_used_as_built() -> None:
    accelerator, precision = CustomAccelerator(), CustomPrecision()
    strategy = DDPStrategy(accelerator=accelerator, precision=precision)

    trainer = Trainer(strategy=strategy, devices=2, logger=False)

    assert trainer.strategy.accelerator is accelerator
    assert trainer.strategy.precision is precision
    assert isinstance(trainer.strategy, DDPStrategy)
    assert trainer.strategy.num_processes == 2


@pytest.fixture
def registered_name() -> Iterator[str]:
    StrategyRegistry.register(
        "static_ddp_at_run_time", DDPStrategy, description="registered by a test",
        start_method="spawn", static_graph=True,
    )  # fmt: skip
    yield "static_ddp_at_run_time"
    StrategyRegistry.remove("static_ddp_at_run_time")


def test_a_name_registered_at_run_time_resolves(registered_name: str) -> None:
    trainer = Trainer(strategy=registered_name, accelerator="cpu", devices=2, logger=False)

    strategy = trainer.strategy
    assert isinstance(strategy, DDPStrategy)
    assert strategy.ddp_kwargs == {"static_graph": True}
    assert strategy.start_method == "spawn"
    assert strategy.num_processes == 2


def test_auto_means_one_device_and_a_single_device_strategy_on_this_machine() -> None:
    trainer = Trainer(accelerator="cpu", logger=False)

    assert isinstance(trainer.strategy, SingleDeviceStrategy)
    assert trainer.strategy.root_device == torch.device("cpu")


def test_auto_strategy_with_several_devices_is_ddp() -> None:
    trainer = Trainer(accelerator="cpu", devices=2, logger=False)

    assert isinstance(trainer.strategy, DDPStrategy)


def test_precision_by_name_and_by_short_int_reaches_the_strategy() -> None:
    assert Trainer(precision="bf16-mixed", logger=False).strategy.precision.name == "bf16-mixed"  # type: ignore[attr-defined]
    assert Trainer(precision=64, logger=False).strategy.precision.name == "64-true"  # type: ignore[attr-defined]


def test_the_choices_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="plait.trainer"):
        connect(strategy="ddp", accelerator="cpu", devices=2)

    text = caplog.text
    assert "accelerator 'cpu': by name" in text
    assert "strategy 'ddp'" in text
    assert "cluster environment" in text


def test_an_environment_plugin_is_passed_to_the_strategy() -> None:
    environment = LocalEnvironment(
        main_address="127.0.0.1",
        main_port=29999,
        world_size=1,
        global_rank=0,
        local_rank=0,
        node_rank=0,
    )

    trainer = Trainer(strategy="ddp", devices=1, plugins=[environment], logger=False)

    assert isinstance(trainer.strategy, DDPStrategy)
    assert trainer.strategy.cluster_environment is environment


# Bad input: each raises ConfigurationError before any process starts.


def _error(**settings: object) -> str:
    with pytest.raises(ConfigurationError) as caught:
        Trainer(**{"logger": False, **settings})  # type: ignore[arg-type]
    return str(caught.value)


def test_an_unknown_strategy_name_suggests_the_closest() -> None:
    message = _error(strategy="dpp_spawn")

    assert "no strategy named 'dpp_spawn'" in message
    assert "did you mean 'ddp_spawn'?" in message


def test_an_unknown_accelerator_name_suggests_the_closest() -> None:
    assert "did you mean 'cpu'?" in _error(accelerator="cpuu")


def test_a_plugin_given_twice_is_named() -> None:
    message = _error(plugins=[CustomPrecision(), TruePrecision()])

    assert "two precision plugins were given" in message


def test_precision_given_to_trainer_and_in_plugins() -> None:
    message = _error(precision="bf16-mixed", plugins=[CustomPrecision()])

    assert "two precisions were given" in message
    assert "fix:" in message


def test_precision_given_to_trainer_and_to_the_strategy() -> None:
    message = _error(strategy=DDPStrategy(precision="64-true"), precision="bf16-mixed")

    assert "two precisions were given" in message
    assert "'64-true' to the strategy" in message


def test_an_accelerator_given_to_trainer_and_to_the_strategy() -> None:
    message = _error(strategy=DDPStrategy(accelerator=CustomAccelerator()), accelerator="cuda")

    assert "two accelerators were given" in message


def test_more_devices_than_exist() -> None:
    message = _error(accelerator="cpu", devices=[0, 1])

    assert "devices" in message
    assert "fix:" in message


def test_an_accelerator_this_machine_lacks() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    message = _error(accelerator="cuda")

    assert "'cuda' is not available on this machine" in message
    assert "accelerator='auto'" in message


def test_several_devices_for_a_one_process_strategy() -> None:
    message = _error(strategy="single_device", devices=2, accelerator="cpu")

    assert "runs on one device" in message
    assert "strategy='ddp'" in message


def test_a_precision_the_device_cannot_run_is_refused_by_what_the_plugin_declares() -> None:
    def cuda_only(*, device_type: str = "cpu") -> TruePrecision:
        if device_type != "cuda":
            raise ConfigurationError(
                f"precision 'cuda-only' cannot run on {device_type}",
                fix="use precision='32-true'",
            )
        return TruePrecision(device_type=device_type)

    PrecisionRegistry.register("cuda-only", cuda_only)
    try:
        message = _error(precision="cuda-only", accelerator="cpu")
    finally:
        PrecisionRegistry.remove("cuda-only")
    assert "cannot run on cpu" in message


def test_a_plugin_of_no_known_kind() -> None:
    message = _error(plugins=[object()])

    assert "neither a Precision, a CheckpointIO, a ClusterEnvironment nor a LayerSync" in message


def test_an_unknown_plugin_name() -> None:
    message = _error(plugins=["bf16-mixd"])

    assert "did you mean 'bf16-mixed'?" in message


def test_a_strategy_that_is_no_strategy() -> None:
    message = _error(strategy=torch.nn.Linear(1, 1))

    assert "not a Strategy" in message


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"max_epochs": 0}, "max_epochs=0 must be an int of at least 1"),
        ({"max_steps": -2}, "max_steps=-2"),
        ({"num_nodes": 0}, "num_nodes=0"),
        ({"accumulate_grad_batches": 0}, "accumulate_grad_batches=0"),
        ({"gradient_clip_val": -1.0}, "gradient_clip_val=-1.0"),
        ({"gradient_clip_algorithm": "nrom"}, "did you mean 'norm'?"),
        ({"limit_train_batches": 1.5}, "a fraction must lie in [0.0, 1.0]"),
        ({"limit_val_batches": -1}, "at least 0"),
        ({"val_check_interval": 0}, "val_check_interval=0"),
        ({"log_every_n_steps": 0}, "log_every_n_steps=0"),
        ({"callbacks": [object()]}, "not a Callback"),
        ({"logger": [object()]}, "not a Logger"),
        ({"devices": "two"}, "devices"),
        ({"num_nodes": 2}, "num_nodes=2"),
    ],
)
def test_invalid_settings_are_named(settings: dict[str, object], expected: str) -> None:
    assert expected in _error(**settings)


SLURM_TASK_3 = {  # sbatch --nodes=2 --ntasks-per-node=2 --gpus-per-task=1, task 3
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "train.sh",
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
    "SLURM_NODELIST": "gpu-[017-018]",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_GPUS_PER_TASK": "1",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "CUDA_VISIBLE_DEVICES": "1",
}


@pytest.fixture
def one_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process sees one GPU (CUDA_VISIBLE_DEVICES holds one), as SLURM's binding leaves it."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_a_gpu_bound_to_each_task_is_every_ranks_cuda_0(
    monkeypatch: pytest.MonkeyPatch, one_visible_gpu: None
) -> None:
    for name, value in SLURM_TASK_3.items():
        monkeypatch.setenv(name, value)

    connection = connect(accelerator="cuda", strategy="ddp", devices=2, num_nodes=2)

    assert connection.strategy.root_device == torch.device("cuda", 0)  # local rank 1's GPU
    assert connection.devices == (0, 1)
    assert any("bound one GPU to each process" in reason for reason in connection.reasons)


def test_one_visible_gpu_for_processes_plait_starts_is_still_too_few(
    monkeypatch: pytest.MonkeyPatch, one_visible_gpu: None
) -> None:
    for name in SLURM_TASK_3:
        monkeypatch.delenv(name, raising=False)

    with pytest.raises(ConfigurationError, match="asks for 2 cuda devices, but this machine has 1"):
        connect(accelerator="cuda", strategy="ddp", devices=2)


def test_an_environment_given_as_a_plugin_is_used_without_reading_the_schedulers_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An interactive shell inside an allocation: some of SLURM's variables, not all.
    for name in SLURM_TASK_3:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    with pytest.raises(ConfigurationError, match="SLURM_JOB_NODELIST is not set"):
        connect(accelerator="cpu", strategy="ddp", devices=2)

    # Lightning's way to turn detection off: its default environment, as a plugin.
    connection = connect(
        accelerator="cpu", strategy="ddp", devices=2, plugins=[LightningEnvironment()]
    )

    strategy = connection.strategy
    assert isinstance(strategy, DDPStrategy)
    assert isinstance(strategy.cluster_environment, LocalEnvironment)
    assert any("given as a plugin" in reason for reason in connection.reasons)


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine says it has four CUDA GPUs (nothing is put on them here)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in SLURM_TASK_3:
        monkeypatch.delenv(name, raising=False)


def test_dp_drives_the_gpus_asked_for_from_one_process_as_in_lightning(four_gpus: None) -> None:
    connection = connect(accelerator="cuda", strategy="dp", devices=2)

    assert type(connection.strategy).__name__ == "DataParallelStrategy"
    assert connection.strategy.world_size == 1
    assert (connection.num_processes, connection.devices) == (1, (0, 1))
    assert connection.strategy.root_device == torch.device("cuda", 0)


def test_auto_devices_in_a_notebook_take_one_gpu_as_in_lightning(
    monkeypatch: pytest.MonkeyPatch, four_gpus: None
) -> None:
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)  # as a REPL or notebook has it

    auto = connect(accelerator="cuda")

    assert isinstance(auto.strategy, SingleDeviceStrategy)
    assert auto.num_processes == 1
    assert any("uses 1 of the 4 GPUs" in reason for reason in auto.reasons)
    # Asked for by number, they are all used, by ranks forked from the session.
    every = connect(accelerator="cuda", devices=4)
    assert isinstance(every.strategy, DDPStrategy)
    assert (every.num_processes, every.strategy.start_method) == (4, "fork")
    # Outside a notebook, 'auto' is every GPU.
    monkeypatch.delattr(sys, "ps1")
    assert connect(accelerator="cuda").num_processes == 4


def test_srun_unused_inside_an_allocation_is_hinted_as_in_lightning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in SLURM_TASK_3:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    # A machine with SLURM's commands and no allocation: nothing to hint.
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        connect(accelerator="cpu", devices=2)

    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # salloc, or sbatch without srun
    with pytest.warns(UserWarning, match=r"start it with srun: srun python"):
        connection = connect(accelerator="cpu", devices=2)
    assert "srun is available but did not start this job" in connection.reasons
    # One process starts nothing on other hosts: nothing to hint.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        connect(accelerator="cpu", devices=1)
