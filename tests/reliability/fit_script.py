"""A user's training script, for fault injection (run by the reliability tests).

    python fit_script.py STRATEGY DEVICES [key=value ...]

Trains a small MLP on random data with ``Trainer(strategy=STRATEGY, devices=DEVICES,
accelerator="cpu", **settings)``. Settings are Python literals (``max_epochs=2``,
``ckpt_path='last'``); ``ckpt_path`` goes to ``fit``. The environment injects faults:

- ``FAIL_RANK`` / ``FAIL_STEP``: that rank raises in ``training_step`` at that global
  step (``FAIL_ONCE=path``: only while ``path`` does not exist; it is created first).
- ``STALL_RANK`` / ``STALL_STEP``: that rank sleeps ``STALL_SECONDS`` there instead
  (after writing ``stalling-RANK`` into the root directory); with ``STALL_MASKED``
  it blocks SIGINT first, as a C call that no signal reaches would.
- ``SIGNAL_STEP``: at that step, rank 0 sends ``SIGNAL`` (default SIGTERM) to
  itself, or to its parent with ``SIGNAL_TO=parent`` (the ddp_spawn launcher).
- ``LOG_NAMES``: ``rank:name,rank:name``: the synced metric each rank logs
  (``LOCAL_NAMES``: the same, not synced).
- ``WIDTH``: the hidden width (a large one makes large checkpoints).
- ``TIMEOUT``: the strategy's collective timeout, in seconds.
- ``SLOW_SAVE``: every checkpoint save takes this many seconds more (slow storage);
  ``saving`` is written into the root directory when one starts.
- ``VALIDATE_FIRST``: ``trainer.validate`` runs before ``fit``, so the faults meet a
  job whose process group outlived a call.
- ``KILL_IN_SAVE``: ``RANK:KIND``: that rank kills itself (SIGKILL) in the middle of the
  run's first sharded save of an epoch's checkpoint (``epoch``) or of ``last.ckpt``
  (``last``): once every rank has written its files, as it digests them, before the
  save is put in place (under ``ddp``, rank 0 is the launcher).
- ``KEEP_EVERY_EPOCH``: keep every epoch's checkpoint (``save_top_k=-1``).
- ``STRATEGY_OPTIONS``: JSON, the strategy's options (``StrategyRegistry.get``).

A rank that fails or stalls so writes the time it did into ``fault``. Rank 0 writes
``result.json`` (its final step and epoch) into ``default_root_dir``;
every rank writes ``seen-RANK.json`` with what it saw: its losses by step, where it
stopped, and the name of the error it raised, if any.
"""

from __future__ import annotations

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import ast
import fnmatch
import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.checkpoint_io import TorchCheckpointIO
from plait.core import Strategy, StrategyRegistry, checkpoint_dirs, seed_everything
from plait.trainer import Callback, ModelCheckpoint, Module, Trainer

if TYPE_CHECKING:
    from plait.core.typing import PathLike

# The sharded strategies' saves import it: here it comes under the pause.
import torch.distributed.checkpoint

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


class Tiny(Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
        )
        self.losses: dict[int, float] = {}
        self._parallel = False

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def _fault_now(self) -> None:
        # When the fault happened (the clock's time): a test's bound counts from here.
        Path(self.trainer.default_root_dir, "fault").write_text(repr(time.time()))

    def _inject(self) -> None:
        rank, step = self.trainer.global_rank, self.trainer.global_step
        if _env_int("FAIL_RANK") == rank and _env_int("FAIL_STEP") == step:
            marker = os.environ.get("FAIL_ONCE")
            if marker is None or not os.path.exists(marker):
                if marker is not None:
                    Path(marker).touch()
                self._fault_now()
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        if _env_int("STALL_RANK") == rank and _env_int("STALL_STEP") == step:
            sys.stderr.write(f"rank {rank} stalls at step {step}\n")
            sys.stderr.flush()
            Path(self.trainer.default_root_dir, f"stalling-{rank}").touch()
            self._fault_now()
            if os.environ.get("STALL_MASKED"):
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            time.sleep(float(os.environ.get("STALL_SECONDS", "600")))
        if rank == 0 and _env_int("SIGNAL_STEP") == step:
            signum = signal.Signals[os.environ.get("SIGNAL", "SIGTERM")]
            target = os.getppid() if os.environ.get("SIGNAL_TO") == "parent" else os.getpid()
            self._fault_now()
            os.kill(target, signum)

    @override
    def configure_model(self) -> None:
        # Under model_parallel: the hidden layer split over the tensor-parallel ranks,
        # then the whole sharded over the data-parallel ones (done once).
        mesh = self.device_mesh
        if mesh is None or "tp" not in (mesh.mesh_dim_names or ()) or self._parallel:
            return
        parallelize_module(self.net, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(self.net, mesh=mesh["dp_shard"])
        self._parallel = True

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        self._inject()
        assert isinstance(batch, list)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)
        self.losses[self.trainer.global_step] = float(loss.detach())
        if os.environ.get("LOG_NAMES") and self.trainer.global_step == 0:
            self._fault_now()  # the ranks log different names from the first step
        for variable, sync in (("LOG_NAMES", True), ("LOCAL_NAMES", False)):
            for entry in filter(None, os.environ.get(variable, "").split(",")):
                rank, name = entry.split(":")
                if int(rank) == self.trainer.global_rank:
                    self.log(name, loss, sync_dist=sync, on_epoch=True)
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        assert isinstance(batch, list)
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class SlowCheckpointIO(TorchCheckpointIO):
    """Storage that takes a while to write: each save first waits ``delay`` seconds."""

    def __init__(self, delay: float, root: str) -> None:
        super().__init__()
        self.delay = delay
        self.root = root

    @override
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        Path(self.root, "saving").touch()
        time.sleep(self.delay)
        super().save_checkpoint(checkpoint, path)


class KillInSave(Callback):
    """Kills this rank (SIGKILL) in the middle of the run's first sharded save of ``kind``.

    In the save itself, not beside it: a sharded save is sealed (its files digested,
    then put in place) once every rank has written, and the rank dies as it digests
    its share, whatever the machine's load. A thread watching the directory instead
    could miss a quick save on a busy machine and kill the next one.
    """

    def __init__(self, rank: int, kind: str) -> None:
        self.rank, self.kind = rank, kind
        self.armed = False

    @override
    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        # Once the run started (what earlier saves left is cleaned by then).
        if trainer.global_rank != self.rank or self.armed:
            return
        self.armed = True
        pattern = "last.ckpt.partial" if self.kind == "last" else "epoch=*.partial"
        digest = checkpoint_dirs.digest_files
        rank, kind = self.rank, self.kind

        def digest_then_die(directory: Path, files: Iterable[str]) -> checkpoint_dirs.Digests:
            if fnmatch.fnmatch(directory.name, pattern):
                sys.stderr.write(f"rank {rank} kills itself in a save of {kind}\n")
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return digest(directory, files)

        # Looked up by seal at each call: every sharded checkpoint IO goes through it.
        checkpoint_dirs.digest_files = digest_then_die


class Seen(Callback):
    """Writes what this rank saw: every loss, and where the run ended."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _write(self, trainer: Trainer, module: Module, error: str | None = None) -> None:
        assert isinstance(module, Tiny)
        path = Path(self.root, f"seen-{trainer.global_rank}.json")
        seen = json.loads(path.read_text()) if path.exists() else {}
        seen.setdefault("losses", {}).update({str(k): v for k, v in module.losses.items()})
        seen.update(global_step=trainer.global_step, epoch=trainer.current_epoch)
        if error is not None:
            seen["error"] = error
        path.write_text(json.dumps(seen))

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        self._write(trainer, module)

    @override
    def on_exception(self, trainer: Trainer, module: Module, exception: BaseException) -> None:
        self._write(trainer, module, error=type(exception).__name__)


def main() -> None:
    strategy, devices, *rest = sys.argv[1:]
    settings: dict[str, object] = {}
    for item in rest:
        key, _, value = item.partition("=")
        settings[key] = ast.literal_eval(value)
    ckpt_path = settings.pop("ckpt_path", None)
    root = str(settings.pop("default_root_dir", os.getcwd()))
    seed_everything(0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
    chosen: Strategy | str = strategy
    options: dict[str, object] = json.loads(os.environ.get("STRATEGY_OPTIONS", "{}"))
    timeout = os.environ.get("TIMEOUT")
    if timeout:
        options["timeout"] = timedelta(seconds=float(timeout))
    if options:
        chosen = StrategyRegistry.get(strategy, **options)
    callbacks: list[Callback] = [Seen(root)]
    kill = os.environ.get("KILL_IN_SAVE")
    if kill:
        rank, kind = kill.split(":")
        callbacks.append(KillInSave(int(rank), kind))
    if os.environ.get("KEEP_EVERY_EPOCH"):
        callbacks.append(ModelCheckpoint(save_top_k=-1))
    slow = os.environ.get("SLOW_SAVE")
    if slow:
        settings["plugins"] = [SlowCheckpointIO(float(slow), root)]
    trainer = Trainer(
        strategy=chosen,
        devices=int(devices),
        accelerator="cpu",
        default_root_dir=root,
        enable_progress_bar=False,
        logger=False,
        callbacks=callbacks,
        **settings,  # type: ignore[arg-type]
    )
    model = Tiny(_env_int("WIDTH") or 16)
    if os.environ.get("VALIDATE_FIRST"):
        trainer.validate(model, DataLoader(TensorDataset(x, y), batch_size=8))
    trainer.fit(model, loader, ckpt_path=ckpt_path)  # type: ignore[arg-type]
    if trainer.is_global_zero:
        result = {"global_step": trainer.global_step, "epoch": trainer.current_epoch}
        Path(root, "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
