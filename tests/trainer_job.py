"""A training job on several processes, as a user writes one (run by test_trainer_distributed).

    python trainer_job.py --strategy ddp --devices 2 --scenario fit --root DIR

Rank 0 writes what it saw to DIR/result.json. Each scenario is one behaviour of the
trainer across ranks.
"""

from __future__ import annotations

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import argparse
import contextlib
import csv
import importlib
import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torchmetrics
from torch.utils.data import DataLoader, Sampler, TensorDataset
from typing_extensions import override

from plait.core import (
    ConfigurationError,
    MethodEnvironment,
    PeerFailedError,
    StrategyRegistry,
    free_port,
    seed_everything,
)
from plait.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy, end_job
from plait.strategies.mesh import is_dtensor
from plait.trainer import Callback, CSVLogger, MLFlowLogger, ModelCheckpoint, Module, Trainer

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from plait.core import Accelerator, ClusterEnvironment

# The sharded strategies' saves import it: here it comes under the pause.
import torch.distributed.checkpoint

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()


def _xy(batch: object) -> tuple[torch.Tensor, torch.Tensor]:
    assert isinstance(batch, list | tuple)
    x, y = batch
    assert isinstance(x, torch.Tensor)
    assert isinstance(y, torch.Tensor)
    return x, y


def dataset(n: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


class Toy(Module):
    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1)
        )
        self.fail_at = fail_at

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        x, y = _xy(batch)
        if self.fail_at is not None and self.trainer.global_rank == 1 and batch_idx == self.fail_at:
            raise RuntimeError("rank 1 gives up")
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)
        self.log(
            "train_seen", len(x), reduce_fx="sum", sync_dist=True, on_step=False, on_epoch=True
        )
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        x, y = _xy(batch)
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)
        self.log("val_seen", len(x), reduce_fx="sum", sync_dist=True)
        # The mean of integers over ranks: 0 on rank 0 and 1 on rank 1 is 0.5, never 0.
        self.log("rank_mean", self.trainer.global_rank, sync_dist=True, batch_size=1)

    @override
    def on_train_epoch_end(self) -> None:
        total = float(sum(p.detach().sum() for p in self.parameters()))
        self.log("weights_max", total, reduce_fx="max", sync_dist=True)
        self.log("weights_min", total, reduce_fx="min", sync_dist=True)

    @override
    def predict_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        x, _ = _xy(batch)
        return self.forward(x)

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Gan(Module):
    """A generator and a discriminator, each with its own optimizer, stepped by hand.

    The discriminator steps every batch, its optimizer toggled; the generator
    accumulates two batches by hand (the first without synchronising). The noise is
    drawn from the sample itself, so any split of a batch over ranks sees the same.
    """

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = torch.nn.Sequential(
            torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)
        )
        self.discriminator = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )

    @override
    def training_step(self, batch: object, batch_idx: int) -> None:
        x, _ = _xy(batch)
        noise = x[:, :2] * 0.5
        optimizers = self.optimizers()
        assert isinstance(optimizers, list)
        generator_opt, discriminator_opt = optimizers
        softplus = torch.nn.functional.softplus
        self.toggle_optimizer(discriminator_opt)
        fake = self.generator(noise).detach()
        real_loss = softplus(-self.discriminator(x)).mean()
        d_loss = real_loss + softplus(self.discriminator(fake)).mean()
        discriminator_opt.zero_grad()
        self.manual_backward(d_loss)
        discriminator_opt.step()
        self.untoggle_optimizer(discriminator_opt)
        last = batch_idx % 2 == 1 or batch_idx + 1 == self.trainer.num_training_batches
        with generator_opt.toggle_model(sync_grad=last):
            g_loss = softplus(-self.discriminator(self.generator(noise))).mean()
            self.manual_backward(g_loss / 2)
        if last:
            generator_opt.step()
            generator_opt.zero_grad()
        self.log("d_loss", d_loss, sync_dist=True)

    @override
    def configure_optimizers(self) -> object:
        return [
            torch.optim.Adam(self.generator.parameters(), lr=0.01),
            torch.optim.Adam(self.discriminator.parameters(), lr=0.01),
        ]


class ByHand(Module):
    """One optimizer stepped by hand: the same on every strategy, DeepSpeed's included."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )

    @override
    def training_step(self, batch: object, batch_idx: int) -> None:
        x, y = _xy(batch)
        optimizer = self.optimizers()
        assert not isinstance(optimizer, list)
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.manual_backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class TensorParallel(Module):
    """A module that parallelizes itself over the strategy's mesh in configure_model."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(4, 8)
        self.down = torch.nn.Linear(8, 1)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.relu(self.up(x)))
        return out

    @override
    def configure_model(self) -> None:
        mesh = self.device_mesh
        if mesh is None or is_parallelized(self):  # one process; a later run of the job
            return
        split_up_and_down(self, mesh)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        x, y = _xy(batch)
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss, sync_dist=True)
        # Summed over the data-parallel ranks only: a tensor-parallel group's ranks
        # read the same samples, and count them once.
        self.log("samples", len(x), reduce_fx="sum", sync_dist=True, on_epoch=True)
        return loss

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.AdamW(self.parameters(), lr=0.05)


class MadeOnTheMesh(Module):
    """A module whose layers are made in configure_model: on the meta device, under
    model_parallel, then parallelized there; each rank materialises its shards."""

    def __init__(self) -> None:
        super().__init__()
        self.up: torch.nn.Linear | None = None
        self.down: torch.nn.Linear | None = None
        self.made_on = ""

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.up is not None
        assert self.down is not None
        out: torch.Tensor = self.down(torch.relu(self.up(x)))
        return out

    @override
    def configure_model(self) -> None:
        if self.up is not None:
            return
        self.up, self.down = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
        self.made_on = self.up.weight.device.type
        mesh = self.device_mesh
        assert mesh is not None
        split_up_and_down(self, mesh)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        x, y = _xy(batch)
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss, sync_dist=True, on_epoch=True)
        return loss

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.AdamW(self.parameters(), lr=0.05)


def _made_on_the_mesh(arguments: argparse.Namespace) -> dict[str, object]:
    module = MadeOnTheMesh()
    trainer = _trainer(arguments, max_epochs=3)
    trainer.fit(module, DataLoader(dataset(40), batch_size=8))
    second = _trainer(arguments, max_epochs=3)  # a second Trainer goes on, parallelized
    second.fit(module, DataLoader(dataset(40), batch_size=8))
    # After the fits, every rank's strategy still answers the job's mesh: rank 0's
    # process (the caller's, under popen) counts one again.
    strategy = second.strategy
    assert isinstance(strategy, ModelParallelStrategy)
    answer = {"mesh": dict(strategy.mesh_shape.sizes), "world": strategy.world_size}
    Path(arguments.root, f"mesh-after-{second.global_rank}.json").write_text(json.dumps(answer))
    return {
        "made_on": module.made_on,
        "loss_epoch": float(trainer.callback_metrics["loss_epoch"]),
        "loss_after": float(second.callback_metrics["loss_epoch"]),
        "global_step": [trainer.global_step, second.global_step],
    }


def split_up_and_down(module: Module, mesh: DeviceMesh) -> None:
    """``up`` split by its outputs and ``down`` by its inputs over ``mesh["tp"]``;
    then the whole sharded over ``mesh["dp_shard"]``."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    parallelize_module(module, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(module, mesh=mesh["dp_shard"])


def is_parallelized(module: torch.nn.Module) -> bool:
    """Whether ``module``'s parameters are DTensors already."""
    return any(is_dtensor(p) for p in module.parameters())


class Lbfgs(Module):
    """A linear fit stepped by LBFGS, which evaluates each step several times."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        x, y = _xy(batch)
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=5)


class Hyper(Module):
    """A model whose shape comes from its arguments, saved with save_hyperparameters."""

    def __init__(self, width: int = 4, lr: float = 0.1, *, name: str = "plain") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
        )

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        x, y = _xy(batch)
        return torch.nn.functional.mse_loss(self.net(x), y)

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class CountsWithAMetric(Module):
    """Counts the validation samples with a torchmetrics object, as Lightning code does."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen = torchmetrics.SumMetric()

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        x, _ = _xy(batch)
        self.layer(x)
        self.seen.update(torch.tensor(float(len(x))))
        self.log("seen", self.seen)


class UnevenSampler(Sampler[int]):
    """Five indices on rank 0, three elsewhere: the ranks disagree on their batch count."""

    def __init__(self) -> None:
        self.count = 5 if int(os.environ.get("RANK", "0")) == 0 else 3

    @override
    def __iter__(self) -> Iterator[int]:
        return iter(range(self.count))

    def __len__(self) -> int:
        return self.count


class ForwardCountingDDP(DDPStrategy):
    """DDP that counts the evaluation forwards this rank runs through its wrapper."""

    forwards = 0

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self.forwards = 0  # counted per run

    @override
    def validation_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        self.forwards += 1
        return super().validation_step(module, *args, **kwargs)

    @override
    def predict_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        self.forwards += 1
        return super().predict_step(module, *args, **kwargs)


class CountForwards(Callback):
    """Writes, in each rank, how many evaluation forwards its strategy ran so far."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _write(self, trainer: Trainer) -> None:
        # Inside the rank: the strategy that ran (a launcher works on copies).
        strategy = trainer.strategy
        assert isinstance(strategy, ForwardCountingDDP)
        path = Path(self.root, f"forwards-{trainer.global_rank}.json")
        seen = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps([*seen, strategy.forwards]))

    @override
    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        self._write(trainer)

    @override
    def on_predict_end(self, trainer: Trainer, module: Module) -> None:
        self._write(trainer)


class CountingDDP(DDPStrategy):
    """DDP that counts the batches run without gradient synchronisation."""

    entered = 0

    @override
    @contextlib.contextmanager
    def no_sync(self, module: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
        CountingDDP.entered += 1
        with super().no_sync(module, enabled):
            yield


class ReportNoSync(Callback):
    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        trainer.callback_metrics["no_sync_batches"] = CountingDDP.entered


class GoesOn(Toy):
    """Toy, with a test step: fit, then validated, tested and predicted as it is."""

    @override
    def test_step(self, batch: object, batch_idx: int) -> None:
        x, y = _xy(batch)
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    @override
    def configure_optimizers(self) -> object:
        # A scheduler made over the optimizer: set-up must keep it driving that one.
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        return {
            "optimizer": optimizer,
            "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1),
        }


class GoesOnTheMesh(GoesOn):
    """GoesOn, parallelizing itself on a mesh: its layers split over ``tp``, then sharded.

    The network is sharded, not the module: ``predict_step`` calls ``self.forward``,
    which runs none of the hooks a ``fully_shard(self)`` would unshard through."""

    @override
    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard  # noqa: PLC0415
        from torch.distributed.tensor.parallel import (  # noqa: PLC0415
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = self.device_mesh
        if mesh is None or is_parallelized(self):  # one process; a later run of the job
            return
        parallelize_module(self.net, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(self.net, mesh=mesh["dp_shard"])


def _goes_on(
    arguments: argparse.Namespace, train: DataLoader[object], val: DataLoader[object]
) -> dict[str, object]:
    # The module object fit shaped (sharded, partitioned, parallelized) goes on to
    # every other stage and to a second fit of a new Trainer, in the same job; the
    # route through a fresh module and the checkpoint must give the same numbers.
    kind = GoesOnTheMesh if arguments.strategy == "model_parallel" else GoesOn
    loader = DataLoader(dataset(9), batch_size=2)
    first = _trainer(arguments, max_epochs=2, enable_checkpointing=True)
    model = kind()
    first.fit(model, train, val)
    assert first.checkpoint_callback is not None
    last = first.checkpoint_callback.last_model_path
    same = {
        "validate": first.validate(model, val)[0]["val_loss"],
        "test": first.test(model, val)[0]["test_loss"],
        "predict": torch.cat(first.predict(model, loader)).flatten().tolist(),  # type: ignore[arg-type]
    }
    fresh = {
        "validate": first.validate(kind(), val, ckpt_path=last)[0]["val_loss"],
        "test": first.test(kind(), val, ckpt_path=last)[0]["test_loss"],
        "predict": torch.cat(first.predict(kind(), loader, ckpt_path=last)).flatten().tolist(),  # type: ignore[arg-type]
    }
    # A second fit: a new Trainer, a new optimizer, the weights the first one left.
    seed_everything(1)
    second = _trainer(arguments, max_epochs=1)
    second.fit(model, train)
    same["fit_again"] = second.validate(model, val)[0]["val_loss"]
    loaded = kind.load_from_checkpoint(last)  # made before the seed: made layers draw
    seed_everything(1)
    third = _trainer(arguments, max_epochs=1)
    third.fit(loaded, train)
    fresh["fit_again"] = third.validate(loaded, val)[0]["val_loss"]
    job = [second.world_size, second.num_nodes, second.global_rank, second.is_global_zero]
    return {"same": same, "fresh": fresh, "job": job}


def _after_the_job(
    arguments: argparse.Namespace, train: DataLoader[object], val: DataLoader[object]
) -> dict[str, object]:
    # A module sharded in a job that has ended cannot go on: a clear error, on every
    # rank, with the fix.
    trainer = _trainer(arguments, max_epochs=1)
    model = GoesOn()
    trainer.fit(model, train)
    end_job()
    try:
        trainer.validate(model, val)
    except ConfigurationError as error:
        return {"error": str(error)}
    return {"error": None}


class RecordModel(Callback):
    """Each rank writes what ``trainer.model`` is once training starts, and its strategy."""

    @override
    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        root = trainer.default_root_dir
        ddp = isinstance(trainer.model, torch.nn.parallel.DistributedDataParallel)
        said = repr(trainer.strategy)
        Path(root, f"model-{trainer.global_rank}.txt").write_text(f"ddp={ddp} {said}")


class StopOnRankOne(Callback):
    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.global_rank == 1 and trainer.current_epoch == 1:
            trainer.should_stop = True


def _start_method(arguments: argparse.Namespace) -> str:
    """The start method the job was told to use; else the strategies' own, popen."""
    return str(arguments.start_method or "popen")


def _trainer(arguments: argparse.Namespace, **settings: object) -> Trainer:
    strategy: object = arguments.strategy
    if arguments.start_method and arguments.strategy != "single_device":
        strategy = StrategyRegistry.get(arguments.strategy, start_method=arguments.start_method)
    options: dict[str, object] = {
        "strategy": strategy,
        "accelerator": "cpu",
        "devices": arguments.devices,
        "default_root_dir": arguments.root,
        "enable_progress_bar": False,
        "logger": False,
        "enable_checkpointing": False,
        **settings,
    }
    return Trainer(**options)  # type: ignore[arg-type]


def _losses(log_dir: str) -> list[float]:
    with open(os.path.join(log_dir, CSVLogger.FILE_NAME)) as file:
        return [float(row["loss"]) for row in csv.DictReader(file) if row.get("loss")]


def _fit(
    arguments: argparse.Namespace, train: DataLoader[object], val: DataLoader[object]
) -> dict[str, object]:
    logger = CSVLogger(arguments.root, name="logs")
    trainer = _trainer(
        arguments, max_epochs=2, profiler="simple", logger=logger, callbacks=[RecordModel()]
    )
    model = GoesOn()  # Toy, with a test step
    trainer.fit(model, train, val)
    metrics = dict(trainer.callback_metrics)
    # Every process that ran fit (or waited for it) says which job it was part of.
    job = [trainer.world_size, trainer.num_nodes, trainer.global_rank]
    Path(arguments.root, f"job-{os.environ.get('RANK', '0')}.json").write_text(json.dumps(job))
    weights = {k: v.flatten().tolist() for k, v in model.state_dict().items()}
    # What a user does next: test, whose rows go below the fit's in the same file.
    trainer.test(model, val)
    logged = None
    if trainer.is_global_zero:  # the rank that writes the file
        with open(os.path.join(logger.log_dir, CSVLogger.FILE_NAME)) as file:
            logged = [sorted(name for name, value in row.items() if value and name != "step")
                      for row in csv.DictReader(file)]  # fmt: skip
    return {"metrics": metrics, "global_step": trainer.global_step,
            "weights": weights, "logged": logged}  # fmt: skip


def _same_steps(
    arguments: argparse.Namespace, module: Module, **settings: object
) -> dict[str, object]:
    return _same_steps_read_by(arguments, module, arguments.devices, settings)


def _same_steps_read_by(
    arguments: argparse.Namespace, module: Module, readers: int, settings: dict[str, object]
) -> dict[str, object]:
    # 8 samples a step whatever the number of ranks, in order: every run takes the
    # steps one process takes. The data-parallel ranks (``readers``) split them: all
    # the ranks, unless a tensor-parallel group reads the same batches.
    per_rank = DataLoader(dataset(40), batch_size=8 // readers)
    trainer = _trainer(arguments, max_epochs=2, enable_checkpointing=True, **settings)
    trainer.fit(module, per_rank)
    if int(os.environ.get("RANK", "0")) != 0:
        return {}
    # The module stays as the strategy left it (sharded, partitioned): its whole
    # state is read from the run's checkpoint, as a user reads it.
    assert trainer.checkpoint_callback is not None
    state = (
        type(module).load_from_checkpoint(trainer.checkpoint_callback.last_model_path).state_dict()
    )
    flat = {k: v.flatten().tolist() for k, v in state.items()}
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return {"global_step": trainer.global_step, "state": flat, "metrics": metrics}


def _spawned(arguments: argparse.Namespace) -> dict[str, object]:
    # FSDP on spawned ranks (copies of the module), without checkpointing: the caller's
    # module is left as it was; the trained shards are saved, never gathered whole.
    if arguments.strategy == "single_device":
        return _same_steps(arguments, Hyper())
    per_rank = DataLoader(dataset(40), batch_size=8 // arguments.devices)
    module = Hyper()
    before = {key: value.clone() for key, value in module.state_dict().items()}
    trainer = _trainer(arguments, max_epochs=2, strategy=FSDPStrategy(start_method="spawn"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, per_rank)
    after = module.state_dict()
    path = trainer.trained_checkpoint_path
    assert path is not None
    state = Hyper.load_from_checkpoint(path).state_dict()
    return {
        "global_step": trainer.global_step,
        "state": {key: value.flatten().tolist() for key, value in state.items()},
        "unchanged": all(torch.equal(before[key], after[key]) for key in before),
        "path": path,
        "warnings": [str(warning.message) for warning in caught],
    }


class Compiled(Callback):
    """Fails the rank whose module the run did not compile."""

    @override
    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        assert module._compiled_call_impl is not None, "the run did not compile the module"


def _compiled(arguments: argparse.Namespace) -> dict[str, object]:
    # torch.compile's graphs without a C++ compiler: dynamo and AOT autograd.
    settings = {"compile": {"backend": "aot_eager"}, "callbacks": [Compiled()]}
    return _same_steps(arguments, Hyper(), **settings)


def _gan(arguments: argparse.Namespace) -> dict[str, object]:
    settings: dict[str, object] = {}
    if arguments.scenario == "gan" and arguments.strategy == "fsdp":
        # Each layer sharded on its own: the step's backward passes run inside the
        # root's forward, and only a block's own hooks reduce its gradients there.
        settings["strategy"] = FSDPStrategy(
            auto_wrap_policy={torch.nn.Linear}, start_method=_start_method(arguments)
        )
    return _same_steps(arguments, Gan(), **settings)


class ClusterByMethods:
    """A cluster environment as Lightning code writes one: methods, told its place.

    plait starts the processes (``creates_processes_externally`` is false), so each
    rank's copy is told its place through ``set_world_size``/``set_global_rank``.
    """

    def __init__(self) -> None:
        self.size = 1
        self.rank = 0
        self.port = int(os.environ.get("MASTER_PORT", "0")) or free_port()

    @property
    def creates_processes_externally(self) -> bool:
        return False

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return self.port

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self.size

    def set_world_size(self, size: int) -> None:
        self.size = size

    def global_rank(self) -> int:
        return self.rank

    def set_global_rank(self, rank: int) -> None:
        self.rank = rank

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def node_rank(self) -> int:
        return 0


class CpusByCount:
    """An accelerator as Lightning code writes one: static methods, a count of CPUs."""

    def setup_device(self, device: torch.device) -> None:
        assert device.type == "cpu"

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


class ReportPlace(Callback):
    """Each rank writes where its environment says it is."""

    def __init__(self, root: str) -> None:
        self.root = root

    @override
    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        strategy = trainer.strategy
        assert isinstance(strategy, DDPStrategy)
        environment = strategy.cluster_environment
        assert isinstance(environment, MethodEnvironment)
        cluster = environment.environment
        assert isinstance(cluster, ClusterByMethods)
        seen = [cluster.world_size(), cluster.global_rank(), strategy.accelerator.name]
        Path(self.root, f"place-{trainer.global_rank}.json").write_text(json.dumps(seen))


def _lightning_parts(arguments: argparse.Namespace, train: DataLoader[object]) -> dict[str, object]:
    # An MLflow logger too, as Lightning code passes one: made on every rank (pickled to
    # spawned ones), it is to make one run, from rank 0.
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    store = (Path(arguments.root) / "mlruns").as_uri()
    trainer = _trainer(
        arguments,
        max_epochs=1,
        accelerator=cast("Accelerator", CpusByCount()),
        plugins=[cast("ClusterEnvironment", ClusterByMethods())],
        callbacks=[ReportPlace(arguments.root)],
        logger=MLFlowLogger("lightning_parts", tracking_uri=store),
        log_every_n_steps=1,
    )
    trainer.fit(Toy(), train)
    places = sorted(Path(arguments.root).glob("place-*.json"))
    client = importlib.import_module("mlflow.tracking").MlflowClient(store)
    experiment = client.get_experiment_by_name("lightning_parts")
    runs = client.search_runs([experiment.experiment_id])
    return {
        "places": [json.loads(path.read_text()) for path in places],
        "mlflow_runs": [
            [run.info.status, len(client.get_metric_history(run.info.run_id, "loss"))]
            for run in runs
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--root", required=True)
    # fork: the ranks are forks of this process (where the launcher is not what a
    # scenario is about); none: as the strategy's launcher starts them.
    parser.add_argument("--start-method", choices=("fork",), default=None)
    arguments = parser.parse_args()
    seed_everything(0)
    result: dict[str, object] = {}
    train = DataLoader(dataset(40), batch_size=4, shuffle=True)
    val = DataLoader(dataset(21), batch_size=4)
    by_function: dict[str, Callable[[], dict[str, object]]] = {
        "fit": lambda: _fit(arguments, train, val),
        "by_hand": lambda: _same_steps(arguments, ByHand()),
        # In float64: LBFGS divides by the curvatures it estimates, which carries a
        # float32 rounding of the ranks' averaged gradients to 4e-5 on some CPUs.
        "lbfgs": lambda: _same_steps(arguments, Lbfgs(), precision="64-true"),
        # torch.compile's graphs without a C++ compiler: dynamo and AOT autograd.
        "compiled": lambda: _compiled(arguments),
        # On model_parallel's mesh of (dp=1, tp=2): both ranks read all 8 samples.
        "tensor_parallel": lambda: _same_steps_read_by(arguments, TensorParallel(), 1, {}),
        "made_on_the_mesh": lambda: _made_on_the_mesh(arguments),
        # A module with no configure_model of its own, on a mesh: refused at set-up.
        "not_parallelized": lambda: _same_steps_read_by(arguments, Toy(), 1, {}),
        "gan": lambda: _gan(arguments),
        "gan_root_only": lambda: _gan(arguments),  # FSDP's root holds the parameters
        "goes_on": lambda: _goes_on(arguments, train, val),
        "after_the_job": lambda: _after_the_job(arguments, train, val),
        "spawned": lambda: _spawned(arguments),
        "lightning_parts": lambda: _lightning_parts(arguments, train),
    }
    if arguments.scenario in by_function:
        result = by_function[arguments.scenario]()
    elif arguments.scenario == "uneven":
        odd = DataLoader(dataset(10), batch_size=3)  # padded by the injected sampler
        custom = DataLoader(dataset(10), batch_size=3, sampler=UnevenSampler())
        first = _trainer(arguments, max_epochs=1)
        first.fit(Toy(), odd, val)
        second = _trainer(arguments, max_epochs=1)
        second.fit(Toy(), custom)
        # 7 samples: 4 on rank 0 (2 batches of 3), 3 on rank 1, which repeats its batch.
        third = _trainer(arguments)
        [counted] = third.validate(CountsWithAMetric(), DataLoader(dataset(7), batch_size=3))
        result = {
            "padded_steps": first.global_step,
            "custom_steps": second.global_step,
            "metric_counted": counted["seen"],
        }
    elif arguments.scenario == "accumulate":
        # 5 batches per rank, accumulating 2 by 2: steps after batches 2, 4 and 5.
        trainer = _trainer(
            arguments,
            strategy=CountingDDP(start_method=_start_method(arguments)),
            max_epochs=1,
            accumulate_grad_batches=2,
            callbacks=[ReportNoSync()],
        )
        trainer.fit(Toy(), train)
        result = {
            "global_step": trainer.global_step,
            "no_sync": trainer.callback_metrics["no_sync_batches"],
        }
    elif arguments.scenario == "stop":
        trainer = _trainer(arguments, max_epochs=5, callbacks=[StopOnRankOne()])
        trainer.fit(Toy(), train)
        result = {"current_epoch": trainer.current_epoch}
    elif arguments.scenario == "fail":
        try:
            _trainer(arguments, max_epochs=1).fit(Toy(fail_at=2), train)
        except PeerFailedError as error:
            result = {"failed_rank": error.rank, "message": str(error)}
    elif arguments.scenario == "even":
        # 9 samples in batches of 2: rank 0 holds 3 batches, rank 1 holds 2 and pads.
        counts = CountForwards(arguments.root)
        trainer = _trainer(
            arguments,
            strategy=ForwardCountingDDP(start_method=_start_method(arguments)),
            callbacks=[counts],
        )
        [metrics] = trainer.validate(Toy(), DataLoader(dataset(9), batch_size=2))
        model = Toy()
        predictions = trainer.predict(model, DataLoader(dataset(9), batch_size=2))
        expected = model.eval()(dataset(9).tensors[0])
        result = {
            "val_seen": metrics["val_seen"],
            "same": bool(torch.allclose(torch.cat(predictions), expected, atol=1e-6)),  # type: ignore[arg-type]
        }
    elif arguments.scenario == "predict":
        model = Toy()
        loader = DataLoader(dataset(11), batch_size=4)
        predictions = _trainer(arguments).predict(model, loader)
        expected = model.eval()(dataset(11).tensors[0])
        result = {"same": bool(torch.allclose(torch.cat(predictions), expected, atol=1e-6))}  # type: ignore[arg-type]
    elif arguments.scenario == "resume":
        logger = CSVLogger(arguments.root, name="whole")
        whole = _trainer(arguments, max_epochs=3, logger=logger, log_every_n_steps=1)
        whole.fit(Toy(), train)
        seed_everything(0)
        part_logger = CSVLogger(arguments.root, name="part")
        checkpoint = ModelCheckpoint(
            Path(arguments.root) / "ckpt", every_n_train_steps=7, save_top_k=0
        )
        part = _trainer(
            arguments,
            max_steps=7,
            logger=part_logger,
            log_every_n_steps=1,
            callbacks=[checkpoint],
            enable_checkpointing=True,
        )
        part.fit(Toy(), train)
        rest_logger = CSVLogger(arguments.root, name="rest")
        checkpoint = ModelCheckpoint(
            Path(arguments.root) / "ckpt", every_n_train_steps=7, save_top_k=0
        )
        rest = _trainer(
            arguments,
            max_epochs=3,
            logger=rest_logger,
            log_every_n_steps=1,
            callbacks=[checkpoint],
            enable_checkpointing=True,
        )
        seed_everything(1)
        rest.fit(Toy(), train, ckpt_path="last")
        if rest.is_global_zero:
            assert whole.log_dir
            assert part.log_dir
            assert rest.log_dir
            result = {
                "whole": _losses(whole.log_dir),
                "resumed": _losses(part.log_dir) + _losses(rest.log_dir),
            }
    else:
        raise SystemExit(f"unknown scenario {arguments.scenario}")
    if int(os.environ.get("RANK", "0")) == 0 and result:
        Path(arguments.root, "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
