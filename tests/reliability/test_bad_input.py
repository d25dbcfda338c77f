"""Bad input at every public entry point: a clear error at once, naming the value and a fix.

One table: the Trainer's arguments, strategy and launcher constructors, registry
calls, collectives, callbacks, checkpoint IO and the command line. Each row says
what is called, the error it must raise, and words its message must hold (the bad
value, and what to write instead).
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from unittest import mock

import attrs
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.checkpoint_io import TorchCheckpointIO
from plait.core import CheckpointError, ConfigurationError, StrategyRegistry
from plait.strategies import (
    DDPShardedStrategy,
    DDPStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
)
from plait.strategies.collectives import LocalCollectives, agreement_path
from plait.strategies.launchers import MultiprocessingLauncher, SubprocessScriptLauncher
from plait.trainer import EarlyStopping, ModelCheckpoint, Module, Trainer
from plait.trainer.cli import main as cli
from plait.trainer.config_cli import run_config


@attrs.frozen
class Case:
    """One bad input: what is called, the error expected, and words its message holds."""

    name: str
    call: Callable[[], object]
    error: type[BaseException] | tuple[type[BaseException], ...]
    says: tuple[str, ...]


def _trainer(**settings: object) -> Callable[[], object]:
    options: dict[str, object] = {"accelerator": "cpu", "logger": False, **settings}
    return lambda: Trainer(**options)  # type: ignore[arg-type]


def _with_environ(name: str, value: str, make: Callable[[], object]) -> Callable[[], object]:
    def call() -> object:
        with mock.patch.dict(os.environ, {name: value}):
            return make()

    return call


def _cli(*argv: str) -> Callable[[], object]:
    return lambda: cli(["fit", "--example", "digits", *argv])


class _Linear(Module):
    """A module whose step goes by hand (``automatic`` False) or returns its loss."""

    def __init__(self, *, automatic: bool) -> None:
        super().__init__()
        self.automatic_optimization = automatic
        self.net = torch.nn.Linear(2, 1)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        (x,) = batch
        loss: torch.Tensor = self.net(x).pow(2).mean()
        self.manual_backward(loss)  # under automatic optimization: refused
        return loss

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.1)


_LINEAR = f"{__name__}._Linear"


def _load_checkpoint_of(class_path: str) -> object:
    # A trainer checkpoint as ModelCheckpoint writes it, of the class named.
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "other.ckpt")
        torch.save({"plait": {"format": 1, "module": class_path}, "state_dict": {}}, path)
        return _Linear.load_from_checkpoint(path)


def _lbfgs() -> torch.optim.Optimizer:
    return torch.optim.LBFGS([torch.nn.Parameter(torch.zeros(2))])


def _fit(module: Module, **settings: object) -> Callable[[], object]:
    options: dict[str, object] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "max_epochs": 1,
        **settings,
    }
    loader = DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)
    return lambda: Trainer(**options).fit(module, loader)  # type: ignore[arg-type]


CASES = [
    # The Trainer's arguments.
    Case("max_epochs=0", _trainer(max_epochs=0), ConfigurationError, ("max_epochs=0", "fix:")),
    Case("max_steps=-2", _trainer(max_steps=-2), ConfigurationError, ("max_steps=-2", "fix:")),
    Case("max_epochs='10'", _trainer(max_epochs="10"), ConfigurationError, ("'10'", "fix:")),
    Case(
        "limit_train_batches=-1",
        _trainer(limit_train_batches=-1),
        ConfigurationError,
        ("limit_train_batches", "-1"),
    ),
    Case(
        "limit_val_batches=1.5",
        _trainer(limit_val_batches=1.5),
        ConfigurationError,
        ("limit_val_batches", "1.5"),
    ),
    Case("val_check_interval=0", _trainer(val_check_interval=0), ConfigurationError, ("fix:",)),
    Case(
        "log_every_n_steps=0",
        _trainer(log_every_n_steps=0),
        ConfigurationError,
        ("log_every_n_steps=0", "fix:"),
    ),
    Case(
        "accumulate_grad_batches=0",
        _trainer(accumulate_grad_batches=0),
        ConfigurationError,
        ("accumulate_grad_batches=0", "fix:"),
    ),
    Case(
        "check_val_every_n_epoch=0",
        _trainer(check_val_every_n_epoch=0),
        ConfigurationError,
        ("check_val_every_n_epoch=0", "fix:"),
    ),
    Case(
        "gradient_clip_val=-1",
        _trainer(gradient_clip_val=-1),
        ConfigurationError,
        ("gradient_clip_val=-1", "fix:"),
    ),
    Case(
        "gradient_clip_algorithm='l3'",
        _trainer(gradient_clip_algorithm="l3"),
        ConfigurationError,
        ("'l3'", "'norm'", "'value'"),
    ),
    Case(
        "trainer.max_epochs = 0",
        lambda: setattr(Trainer(accelerator="cpu", logger=False), "max_epochs", 0),
        ConfigurationError,
        ("max_epochs=0", "fix:"),
    ),
    Case(
        "save_checkpoint outside a run",
        lambda: Trainer(accelerator="cpu", logger=False).save_checkpoint("late.ckpt"),
        ConfigurationError,
        ("no run is in progress", "late.ckpt", "fix:"),
    ),
    # Manual optimization.
    Case(
        "manual_backward under automatic optimization",
        _fit(_Linear(automatic=True)),
        ConfigurationError,
        ("manual_backward", "automatic optimization", "automatic_optimization = False"),
    ),
    Case(
        "gradient_clip_val with manual optimization",
        _fit(_Linear(automatic=False), gradient_clip_val=1.0),
        ConfigurationError,
        ("gradient_clip_val=1.0", "self.clip_gradients"),
    ),
    Case(
        "accumulate_grad_batches with manual optimization",
        _fit(_Linear(automatic=False), accumulate_grad_batches=2),
        ConfigurationError,
        ("accumulate_grad_batches=2", "toggle_model(sync_grad=False)"),
    ),
    # Optimizers that step with a closure (LBFGS), where they cannot work.
    Case(
        "LBFGS on FSDP",
        lambda: FSDPStrategy().check_closure_optimizer(_lbfgs()),
        ConfigurationError,
        ("LBFGS", "FSDPStrategy shards them", "strategy='ddp'"),
    ),
    Case(
        "LBFGS on ModelParallelStrategy",
        lambda: ModelParallelStrategy().check_closure_optimizer(_lbfgs()),
        ConfigurationError,
        ("LBFGS", "ModelParallelStrategy shards them"),
    ),
    # Model parallelism: the mesh's sizes.
    Case(
        "a tensor-parallel size that is not a size",
        lambda: ModelParallelStrategy(tensor_parallel_size=0),
        ConfigurationError,
        ("tensor_parallel_size=0", "'auto'"),
    ),
    Case(
        "replicas that do not divide the data-parallel ranks",
        lambda: ModelParallelStrategy(data_parallel_size=4, data_parallel_replicate_size=3),
        ConfigurationError,
        ("data_parallel_replicate_size=3", "data_parallel_size=4", "divides"),
    ),
    Case(
        "mesh sizes that do not make the world",
        lambda: ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2).mesh_shape,
        ConfigurationError,
        ("data_parallel_size=1 x tensor_parallel_size=2", "the world has 1", "product is 1"),
    ),
    Case(
        "model parallelism with a checkpoint IO that writes on rank 0",
        lambda: ModelParallelStrategy(checkpoint_io="torch"),
        ConfigurationError,
        ("every rank write its shards", "checkpoint_io='distributed'"),
    ),
    Case(
        "LBFGS on DDPShardedStrategy",
        lambda: DDPShardedStrategy().check_closure_optimizer(_lbfgs()),
        ConfigurationError,
        ("LBFGS", "partitions the optimizer", "fix:"),
    ),
    Case(
        "LBFGS with 16-mixed",
        lambda: SingleDeviceStrategy("cpu", precision="16-mixed").check_closure_optimizer(_lbfgs()),
        ConfigurationError,
        ("LBFGS", "gradient scaler", "bf16-mixed"),
    ),
    Case(
        "compile={'mdoe': ...}",
        _trainer(compile={"mdoe": "max-autotune"}),
        ConfigurationError,
        ("'mdoe'", "'mode'"),
    ),
    Case("profiler='simpel'", _trainer(profiler="simpel"), ConfigurationError, ("'simple'?",)),
    Case(
        "load_from_checkpoint of another class's checkpoint",
        lambda: _load_checkpoint_of("my_pkg.Classifier"),
        ConfigurationError,
        ("a checkpoint of my_pkg.Classifier", "Classifier.load_from_checkpoint(path)"),
    ),
    # plait fit --model ...: your own module from the command line and configs.
    Case(
        "--model naming a missing class",
        lambda: run_config(["fit", "--model", "plait.trainer.NoSuchModule"]),
        ConfigurationError,
        ("NoSuchModule", "fix:"),
    ),
    Case(
        "--trainer.max_epochs of the wrong type",
        lambda: run_config(["fit", "--model", _LINEAR, "--trainer.max_epochs", "many"]),
        ConfigurationError,
        ("trainer.max_epochs", "many"),
    ),
    Case(
        "--trainer.max_epoch (a typo)",
        lambda: run_config(["fit", "--model", _LINEAR, "--trainer.max_epoch", "3"]),
        ConfigurationError,
        ("did you mean --trainer.max_epochs?",),
    ),
    # Debugging runs.
    Case(
        "fast_dev_run=-1",
        _trainer(fast_dev_run=-1),
        ConfigurationError,
        ("fast_dev_run=-1", "fast_dev_run=True"),
    ),
    Case(
        "overfit_batches=1.5",
        _trainer(overfit_batches=1.5),
        ConfigurationError,
        ("overfit_batches", "1.5"),
    ),
    Case(
        "num_sanity_val_steps=-2",
        _trainer(num_sanity_val_steps=-2),
        ConfigurationError,
        ("num_sanity_val_steps=-2", "fix:"),
    ),
    Case("strategy='dpp'", _trainer(strategy="dpp"), ConfigurationError, ("'dpp'", "'ddp'?")),
    Case(
        "accelerator='cpuu'",
        lambda: Trainer(accelerator="cpuu"),
        ConfigurationError,
        ("'cpuu'", "'cpu'?"),
    ),
    Case("precision='17'", _trainer(precision="17"), ConfigurationError, ("'17'", "32-true")),
    Case("num_nodes=0", _trainer(num_nodes=0), ConfigurationError, ("num_nodes", "0")),
    Case("devices=0", _trainer(devices=0), ConfigurationError, ("devices", "0")),
    Case("logger=3", _trainer(logger=3), ConfigurationError, ("logger=3", "fix:")),
    Case("callbacks=[3]", _trainer(callbacks=[3]), ConfigurationError, ("int", "fix:")),
    Case(
        "checkpoint_timeout=0",
        _trainer(checkpoint_timeout=0),
        ConfigurationError,
        ("checkpoint_timeout=0", "fix:"),
    ),
    Case(
        "checkpoint_timeout=timedelta(0)",
        _trainer(checkpoint_timeout=timedelta(0)),
        ConfigurationError,
        ("checkpoint_timeout", "fix:"),
    ),
    Case(
        "stop_timeout=-5",
        _trainer(stop_timeout=-5),
        ConfigurationError,
        ("stop_timeout=-5", "fix:"),
    ),
    Case(
        "stop_timeout='soon'",
        _trainer(stop_timeout="soon"),
        ConfigurationError,
        ("stop_timeout", "'soon'"),
    ),
    Case(
        "stop_signals=['SIGKILL']",
        _trainer(stop_signals=["SIGKILL"]),
        ConfigurationError,
        ("'SIGKILL'", "'SIGTERM'", "cannot be caught"),
    ),
    Case(
        "stop_signals='SIGTERM'",
        _trainer(stop_signals="SIGTERM"),
        ConfigurationError,
        ("'SIGTERM'", "list of signals", "fix:"),
    ),
    Case(
        "stop_signals=['SIGTREM']",
        _trainer(stop_signals=["SIGTREM"]),
        ConfigurationError,
        ("'SIGTREM'", "'SIGTERM'?"),
    ),
    Case(
        "default_root_dir unwritable",
        _trainer(default_root_dir="/proc/plait"),
        ConfigurationError,
        ("/proc/plait", "fix:"),
    ),
    Case(
        "enable_checkpointing=False with a ModelCheckpoint",
        _trainer(enable_checkpointing=False, callbacks=[ModelCheckpoint()]),
        ConfigurationError,
        ("enable_checkpointing=False", "fix:"),
    ),
    # Strategies and launchers.
    Case(
        "DDPStrategy(process_group_backend='glo')",
        lambda: DDPStrategy(process_group_backend="glo"),
        ConfigurationError,
        ("'glo'", "'gloo'?"),
    ),
    Case(
        "DDPStrategy(timeout=5)",
        lambda: DDPStrategy(timeout=5),  # type: ignore[arg-type]
        ConfigurationError,
        ("timeout=5", "timedelta"),
    ),
    Case(
        "PLAIT_CHECK_AGREEMENT=backnd",
        _with_environ("PLAIT_CHECK_AGREEMENT", "backnd", DDPStrategy),
        ConfigurationError,
        ("PLAIT_CHECK_AGREEMENT", "'backnd'", "'backend'?", "fix:"),
    ),
    Case(
        "agreement_path('storee', 4)",
        lambda: agreement_path("storee", 4),
        ConfigurationError,
        ("'storee'", "'store'?"),
    ),
    Case(
        "DDPStrategy(start_method='spwan')",
        lambda: DDPStrategy(start_method="spwan"),
        ConfigurationError,
        ("'spwan'", "'spawn'?"),
    ),
    Case(
        "DDPStrategy(ddp_comm_state=...) without a hook",
        lambda: DDPStrategy(ddp_comm_state=object()),
        ConfigurationError,
        ("ddp_comm_hook", "fix:"),
    ),
    Case(
        "SingleDeviceStrategy(device='cpuu')",
        lambda: SingleDeviceStrategy(device="cpuu"),
        (ConfigurationError, RuntimeError),
        ("cpuu",),
    ),
    Case(
        "MultiprocessingLauncher(0)",
        lambda: MultiprocessingLauncher(0),
        ConfigurationError,
        ("num_processes=0", "fix:"),
    ),
    Case(
        "MultiprocessingLauncher(start_method='forkk')",
        lambda: MultiprocessingLauncher(2, start_method="forkk"),
        ConfigurationError,
        ("'forkk'", "'fork'?"),
    ),
    Case(
        "SubprocessScriptLauncher(True)",
        lambda: SubprocessScriptLauncher(num_processes=True),
        ConfigurationError,
        ("num_processes=True", "fix:"),
    ),
    # Registries.
    Case(
        "StrategyRegistry.get('dpp')",
        lambda: StrategyRegistry.get("dpp"),
        ConfigurationError,
        ("'dpp'", "'ddp'?"),
    ),
    Case(
        "StrategyRegistry.get('ddp_spwan')",
        lambda: StrategyRegistry.get("ddp_spwan"),
        ConfigurationError,
        ("'ddp_spwan'", "'ddp_spawn'?"),
    ),
    Case(
        "StrategyRegistry.register('ddp', ...) again",
        lambda: StrategyRegistry.register("ddp", DDPStrategy),
        ConfigurationError,
        ("'ddp'", "override=True"),
    ),
    Case(
        "StrategyRegistry.register of a non-strategy",
        lambda: StrategyRegistry.register("not_a_strategy", object),
        ConfigurationError,
        ("object", "missing: all_gather", "fix:"),
    ),
    # Collectives.
    Case(
        "reduce('x')",
        lambda: LocalCollectives(torch.device("cpu")).reduce("x"),  # type: ignore[call-overload]
        TypeError,
        ("str", "tensor"),
    ),
    Case(
        "reduce(op='avgg')",
        lambda: LocalCollectives(torch.device("cpu")).reduce(1.0, reduce_op="avgg"),
        ConfigurationError,
        ("'avgg'", "'avg'?"),
    ),
    Case(
        "broadcast(src=3) on one rank",
        lambda: LocalCollectives(torch.device("cpu")).broadcast(1, src=3),
        ValueError,
        ("src=3", "[0, 1)"),
    ),
    Case(
        "barrier(timeout=-1)",
        lambda: LocalCollectives(torch.device("cpu")).barrier("x", timeout=-1),
        ValueError,
        ("timeout=-1", "positive"),
    ),
    Case(
        "all_gather([1])",
        lambda: LocalCollectives(torch.device("cpu")).all_gather([1]),  # type: ignore[arg-type]
        TypeError,
        ("list", "tensor"),
    ),
    # Callbacks.
    Case(
        "ModelCheckpoint(mode='middle')",
        lambda: ModelCheckpoint(mode="middle"),  # type: ignore[arg-type]
        ConfigurationError,
        ("'middle'", "'min'"),
    ),
    Case(
        "ModelCheckpoint(save_top_k=3) without monitor",
        lambda: ModelCheckpoint(save_top_k=3),
        ConfigurationError,
        ("save_top_k=3", "monitor", "fix:"),
    ),
    Case(
        "ModelCheckpoint(every_n_epochs=0)",
        lambda: ModelCheckpoint(every_n_epochs=0),
        ConfigurationError,
        ("every_n_epochs=0", "fix:"),
    ),
    Case(
        "EarlyStopping(mode='up')",
        lambda: EarlyStopping("val_loss", mode="up"),  # type: ignore[arg-type]
        ConfigurationError,
        ("'up'", "'max'"),
    ),
    # Checkpoint IO.
    Case(
        "load_checkpoint(missing)",
        lambda: TorchCheckpointIO().load_checkpoint("/nonexistent/plait.ckpt"),
        CheckpointError,
        ("/nonexistent/plait.ckpt", "does not exist", "fix:"),
    ),
    Case(
        "remove_checkpoint(missing)",
        lambda: TorchCheckpointIO().remove_checkpoint("/nonexistent/plait.ckpt"),
        CheckpointError,
        ("/nonexistent/plait.ckpt", "does not exist"),
    ),
]

CLI_CASES = [
    ("--batch-size 0", ("--batch-size", "0 is below 1")),
    ("--batch-size x", ("--batch-size", "'x' is not a whole number")),
    ("--lr -1", ("--lr", "-1 must be a finite number above 0")),
    ("--lr nan", ("--lr", "nan must be a finite number above 0")),
    ("--max-epochs 0", ("--max-epochs", "0 is below 1")),
    ("--max-steps -5", ("--max-steps", "-5 is below -1")),
    ("--accumulate-grad-batches 0", ("--accumulate-grad-batches", "0 is below 1")),
    ("--gradient-clip-val 0", ("--gradient-clip-val", "0 must be a finite number above 0")),
    ("--num-nodes 0", ("--num-nodes", "0 is below 1")),
    ("--tensor-parallel-size 0", ("--tensor-parallel-size", "0 is below 1")),
    ("--logger csvv", ("--logger", "invalid choice: 'csvv'")),
]


def test_the_table_covers_every_kind_of_entry_point() -> None:
    # The count is reported; every entry point's kind is represented.
    assert len(CASES) + len(CLI_CASES) >= 50


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_raises_a_clear_error_at_once(case: Case) -> None:
    with pytest.raises(case.error) as raised:
        case.call()

    message = str(raised.value)
    for words in case.says:
        assert words in message, f"{words!r} missing from: {message}"


@pytest.mark.parametrize(("flags", "says"), CLI_CASES, ids=[flags for flags, _ in CLI_CASES])
def test_bad_command_line_flags_are_refused_by_name(
    capsys: pytest.CaptureFixture[str], flags: str, says: tuple[str, ...]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _cli(*flags.split())()

    assert exited.value.code == 2
    error = capsys.readouterr().err
    for words in says:
        assert words in error, f"{words!r} missing from: {error}"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ("--strategy dpp", ("'dpp'", "did you mean 'ddp'?")),
        ("--default-root-dir /proc/plait", ("/proc/plait", "fix:")),
        ("--accelerator gpu", ("'cuda' is not available", "fix:")),
        ("--precision 17", ("'17'", "32-true")),
        (
            "--strategy ddp --tensor-parallel-size 2",
            ("--tensor-parallel-size 2", "'ddp'", "--strategy model_parallel"),
        ),
    ],
)
def test_bad_command_line_values_print_the_error_and_exit_2(
    capsys: pytest.CaptureFixture[str], flags: str, says: tuple[str, ...]
) -> None:
    status = _cli(*flags.split())()

    assert status == 2
    error = capsys.readouterr().err
    assert error.startswith("plait: error:")
    assert "Traceback" not in error
    for words in says:
        assert words in error, f"{words!r} missing from: {error}"


def test_more_processes_than_cores_are_announced_before_they_start(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from plait.strategies.launchers.children import warn_if_oversubscribed  # noqa: PLC0415

    warn_if_oversubscribed(4096)

    assert "plait: starting 4096 processes on" in capfd.readouterr().err


def test_stop_signals_resolve_names_and_numbers() -> None:
    trainer = Trainer(accelerator="cpu", logger=False, stop_signals=["term", signal.SIGUSR1])

    assert trainer.stop_signals == (signal.SIGTERM, signal.SIGUSR1)
