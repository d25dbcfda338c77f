"""The FSDP workload that tools/bench times: one model, sharded (or not) by each side, on 2 ranks.

    python tools/bench_fsdp.py --side plait-trainer --width 512 --steps 100 --out result.json

Every side trains the same model (4 residual blocks of ``width`` x ``width``, AdamW)
on the same batches made beforehand (no loader), on two gloo processes, and rank 0
writes to ``--out``: seconds per step (after a warm-up), the bytes of parameters,
gradients and optimizer state it holds (its shards'), and how much its peak
resident memory grew from just before the model was built.

Sides: ``plain-ddp`` (hand-written DDP), ``plain-fsdp2`` (hand-written FSDP2: each
block, then the root, ``fully_shard``-ed), ``plait-strategy`` (`FSDPStrategy` in
that hand-written loop), and ``plait-trainer`` (plait's Trainer with
``FSDPStrategy``). Lightning's FSDP strategy refuses the CPU ("requires a GPU
accelerator"), so it has no side here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

import torch
import torch.distributed as dist

# Imported by every side before anything is measured: their cost is not the model's.
import torch.distributed.checkpoint.state_dict
import torch.distributed.device_mesh
import torch.distributed.fsdp
from torch import nn
from typing_extensions import override

from plait.strategies import FSDPStrategy
from plait.trainer import Callback, Module, Trainer

WARMUP: Final = 5
BATCH: Final = 32
BLOCKS: Final = 4
SIDES: Final = ("plain-ddp", "plain-fsdp2", "plait-strategy", "plait-trainer")


class Block(nn.Module):
    """A residual block: the unit every sharding side shards on its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + torch.relu(self.linear(x))
        return out


def model(width: int) -> nn.Sequential:
    """The model every side trains."""
    torch.manual_seed(0)
    return nn.Sequential(*(Block(width) for _ in range(BLOCKS)), nn.Linear(width, 1))


def batches(width: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same batches on every rank and side, made beforehand."""
    generator = torch.Generator().manual_seed(1)
    made = []
    for _ in range(WARMUP + steps):
        x = torch.randn(BATCH, width, generator=generator)
        made.append((x, x.mean(dim=1, keepdim=True)))
    return made


def _local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    total = 0
    for tensor in tensors:
        to_local = getattr(tensor, "to_local", None)
        local: torch.Tensor = to_local() if callable(to_local) else tensor
        total += local.numel() * local.element_size()
    return total


def held_bytes(module: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state this rank holds (its shards only)."""
    parameters = list(module.parameters())
    state = [
        value
        for per_parameter in optimizer.state.values()
        for value in per_parameter.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    ]
    grads = [p.grad for p in parameters if p.grad is not None]
    return _local_bytes(parameters) + _local_bytes(grads) + _local_bytes(state)


def peak_rss() -> int:
    """This process's peak resident memory so far, in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Record:
    """Step times and memory, as rank 0 reports them."""

    def __init__(self, steps: int, out: Path) -> None:
        self.steps, self.out = steps, out
        self.baseline = peak_rss()
        self.held = 0
        self._start = 0.0

    def step_ended(self, done: int, held: Callable[[], int]) -> None:
        """Step ``done`` (from 1) has ended."""
        if done == WARMUP:
            self.held = held()
            self._start = time.perf_counter()
        elif done == WARMUP + self.steps:
            result = {
                "per_step": (time.perf_counter() - self._start) / self.steps,
                "held_bytes": self.held,
                "peak_growth": peak_rss() - self.baseline,
            }
            self.out.write_text(json.dumps(result), encoding="utf-8")


def _shard_by_hand(layers: nn.Sequential) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in layers:
        if isinstance(layer, Block):
            fully_shard(layer, mesh=mesh)
    fully_shard(layers, mesh=mesh)
    return layers


def hand_written(  # noqa: PLR0917 (torch.multiprocessing.spawn passes them by position)
    rank: int, side: str, port: int, width: int, steps: int, out: Path
) -> None:
    """A hand-written loop on one rank: DDP, FSDP2, or FSDPStrategy in the loop."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")  # fmt: skip
    torch.set_num_threads(1)
    data = batches(width, steps)
    record = Record(steps, out)
    strategy = None
    if side == "plait-strategy":
        strategy = FSDPStrategy(accelerator="cpu", auto_wrap_policy={Block})
        strategy.setup_environment()
        layers = model(width)
        wrapped, [optimizer] = strategy.setup_module_and_optimizers(
            layers, [torch.optim.AdamW(layers.parameters(), lr=1e-3)]
        )
    else:
        dist.init_process_group("gloo")
        layers = model(width)
        if side == "plain-ddp":
            wrapped = nn.parallel.DistributedDataParallel(layers)
        else:
            wrapped = _shard_by_hand(layers)
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    for done, (x, y) in enumerate(data, start=1):
        if strategy is not None:
            prediction = strategy.training_step(wrapped, x)
            assert isinstance(prediction, torch.Tensor)
            loss = nn.functional.mse_loss(prediction, y)
            strategy.backward(loss, wrapped)
            strategy.optimizer_step(optimizer)
            if rank == 0:
                record.step_ended(done, lambda: held_bytes(wrapped, optimizer))
            strategy.zero_grad(optimizer)
        else:
            loss = nn.functional.mse_loss(wrapped(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            if rank == 0:
                record.step_ended(done, lambda: held_bytes(wrapped, optimizer))
            optimizer.zero_grad(set_to_none=True)
    if strategy is not None:
        strategy.teardown()
    else:
        dist.destroy_process_group()


class Regression(Module):
    """plait's module for the Trainer side."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = model(width)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, tuple)
        x, y = batch
        loss: torch.Tensor = nn.functional.mse_loss(self.layers(x), y)
        return loss

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Timing(Callback):
    """Tells a Record of each step's end, on rank 0 (the Trainer side)."""

    def __init__(self, steps: int, out: Path) -> None:
        self.steps, self.out = steps, out
        self.record: Record | None = None
        self.held = 0

    @override
    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        torch.set_num_threads(1)

    @override
    def on_before_optimizer_step(
        self, trainer: Trainer, module: Module, optimizer: torch.optim.Optimizer
    ) -> None:
        if trainer.global_step + 1 == WARMUP:
            self.held = held_bytes(module, optimizer)  # gradients are there now

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        if trainer.is_global_zero and self.record is not None:
            self.record.step_ended(trainer.global_step, lambda: self.held)


def plait_trainer(width: int, steps: int, out: Path) -> None:
    """plait's Trainer with FSDPStrategy, its own launcher starting the second rank."""
    timing = Timing(steps, out)
    timing.record = Record(steps, out)  # before the model is built
    trainer = Trainer(
        strategy=FSDPStrategy(auto_wrap_policy={Block}),
        accelerator="cpu",
        devices=2,
        max_steps=WARMUP + steps,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[timing],
    )
    trainer.fit(Regression(width), batches(width, steps))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def main(argv: list[str] | None = None) -> int:
    """Run one side on two ranks; rank 0 writes its figures to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.side == "plait-trainer":
        plait_trainer(args.width, args.steps, args.out)
    else:
        from torch.multiprocessing.spawn import spawn  # noqa: PLC0415

        spawned = (args.side, _free_port(), args.width, args.steps, args.out)
        spawn(hand_written, spawned, nprocs=2)  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    sys.exit(main())
