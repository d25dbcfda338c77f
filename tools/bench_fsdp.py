"""The sharding workload tools/bench times: one model, sharded (or not) by each side, on 2 ranks.

    python tools/bench_fsdp.py --side plait-trainer --width 512 --steps 100 --out result.json
    python tools/bench_fsdp.py --side plait-trainer --accelerator cuda --ranks 1 --out r.json

Every side trains the same model (4 residual blocks of ``width`` x ``width``, AdamW)
on the same batches made beforehand (no loader), on two gloo processes (or
``--ranks`` processes on NCCL, one per GPU, with ``--accelerator cuda``), and rank 0
writes to ``--out``: seconds per step (after a warm-up), the bytes of parameters,
gradients and optimizer state it holds (its shards'), the bytes of parameters and
optimizer state alone (with any fp32 master copies: DeepSpeed keeps its gradients in
buffers of its own), how much its peak resident memory grew from just before the
model was built, and on CUDA how much its peak of allocated GPU memory
(``torch.cuda.max_memory_allocated``) grew from then.

FSDP sides: ``plain-ddp`` (hand-written DDP), ``plain-fsdp2`` (hand-written FSDP2:
each block, then the root, ``fully_shard``-ed), ``plait-strategy`` (`FSDPStrategy`
in that hand-written loop), and ``plait-trainer`` (plait's Trainer with
``FSDPStrategy``). DeepSpeed sides: ``plain-deepspeed`` (a hand-written loop on
``deepspeed.initialize`` at ZeRO stage 2; ``plain-deepspeed-3``, at stage 3 with its
buckets sized from the model as plait sizes them), ``plait-deepspeed-strategy``
(`DeepSpeedStrategy` at stage 2 in that loop) and ``plait-deepspeed-0`` to
``plait-deepspeed-3`` (plait's Trainer at each ZeRO stage), and
``plait-deepspeed-2-deterministic`` (stage 2 with ``deterministic=True``, where torch
fills every new tensor). Lightning's FSDP and
DeepSpeed strategies refuse the CPU ("requires a GPU accelerator", "only supported
on CUDA GPUs"), so they have no side here.

Model-parallel sides (4 gloo ranks, ``--ranks 4``), on a model of 4 MLP blocks (an
up and a down projection, ``width`` x ``width`` each) that tensor parallelism splits:
``mesh-ddp`` and ``mesh-fsdp2`` (hand-written DDP and FSDP2 over the 4 ranks),
``mesh-2x2`` (hand-written: a (dp=2, tp=2) mesh, ``ColwiseParallel`` up and
``RowwiseParallel`` down on ``tp``, each block and the root ``fully_shard``-ed on
``dp``), ``plait-mesh-strategy`` (`ModelParallelStrategy` on 2x2 in that loop, the same
plan on its ``device_mesh``) and ``plait-mesh-trainer`` (plait's Trainer with
`ModelParallelStrategy`, the module applying the plan in ``configure_model``). The
data-parallel ranks read batches of their own; a tensor-parallel group, the same one.
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, cast

import torch
import torch.distributed as dist

# Imported by every side before anything is measured: their cost is not the model's.
import torch.distributed.checkpoint.state_dict
import torch.distributed.device_mesh
import torch.distributed.fsdp
import torch.distributed.tensor.parallel
from torch import nn
from typing_extensions import override

from plait.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from plait.strategies.deepspeed.config import sized_buckets
from plait.strategies.job import leave
from plait.trainer import Callback, Module, Trainer

# Run as a script: the repository root holds the ``tools`` package its helper is in.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import two_ranks

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

WARMUP: Final = 5
BATCH: Final = 32
BLOCKS: Final = 4
FSDP_SIDES: Final = ("plain-ddp", "plain-fsdp2", "plait-strategy", "plait-trainer")
DEEPSPEED_SIDES: Final = (
    "plain-deepspeed",
    "plain-deepspeed-3",
    "plait-deepspeed-strategy",
    *(f"plait-deepspeed-{stage}" for stage in range(4)),
    "plait-deepspeed-2-deterministic",
)
MESH_SIDES: Final = (
    "mesh-ddp", "mesh-fsdp2", "mesh-2x2", "plait-mesh-strategy", "plait-mesh-trainer",
)  # fmt: skip
SIDES: Final = (*FSDP_SIDES, *DEEPSPEED_SIDES, *MESH_SIDES)
# The hand-written DeepSpeed loop's configuration (the strategy derives the same).
DEEPSPEED_CONFIG: Final = {
    "train_micro_batch_size_per_gpu": BATCH,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 0.0,
    "zero_optimization": {"stage": 2},
    "zero_allow_untested_optimizer": True,
}


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


class MLPBlock(nn.Module):
    """A residual MLP block: what tensor parallelism splits (up by columns, down by rows)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, width)
        self.down = nn.Linear(width, width)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(x)))
        return out


def mesh_model(width: int) -> nn.Sequential:
    """The model every model-parallel side trains."""
    torch.manual_seed(0)
    return nn.Sequential(*(MLPBlock(width) for _ in range(BLOCKS)), nn.Linear(width, 1))


def split_over(layers: nn.Module, tensor: DeviceMesh, data: DeviceMesh) -> None:
    """The plan of the 2x2 sides: tensor parallel on ``tensor``, then FSDP2 on ``data``."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for block in layers.children():
        if isinstance(block, MLPBlock):
            parallelize_module(block, tensor, {"up": ColwiseParallel(), "down": RowwiseParallel()})
            fully_shard(block, mesh=data)
    fully_shard(layers, mesh=data)


def batches(width: int, steps: int, reader: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batches of data-parallel rank ``reader``, the same on every side, made beforehand."""
    generator = torch.Generator().manual_seed(1 + reader)
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


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [
        value
        for per_parameter in optimizer.state.values()
        for value in per_parameter.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    ]


def held_bytes(module: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state this rank holds (its shards only)."""
    parameters = list(module.parameters())
    grads = [p.grad for p in parameters if p.grad is not None]
    return _local_bytes(parameters) + _local_bytes(grads) + _local_bytes(_state_tensors(optimizer))


def weights_and_optimizer_bytes(module: nn.Module, optimizer: object) -> int:
    """Parameters (this rank's partitions), optimizer state and fp32 master copies.

    ``optimizer`` is a torch optimizer, or DeepSpeed's ZeRO optimizer wrapping one
    whose parameters are this rank's fp32 partitions.
    """
    own = {id(p) for p in module.parameters()}
    parameters = [getattr(p, "ds_tensor", p) for p in module.parameters()]
    inner = getattr(optimizer, "optimizer", optimizer)
    assert isinstance(inner, torch.optim.Optimizer)
    masters = [p for group in inner.param_groups for p in group["params"] if id(p) not in own]
    return _local_bytes(parameters) + _local_bytes(masters) + _local_bytes(_state_tensors(inner))


def peak_rss() -> int:
    """This process's peak resident memory so far, in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Record:
    """Step times and memory, as rank 0 reports them."""

    def __init__(self, steps: int, out: Path, device: torch.device | None = None) -> None:
        self.steps, self.out = steps, out
        self.device = device if device is not None and device.type == "cuda" else None
        self.cuda_baseline = 0
        if self.device is not None:
            torch.cuda.init()  # type: ignore[no-untyped-call]  # the allocator's statistics exist only once CUDA has started
            torch.cuda.reset_peak_memory_stats(self.device)
            self.cuda_baseline = torch.cuda.memory_allocated(self.device)
        self.baseline = peak_rss()
        self.held = 0
        self.weights = 0
        self._start = 0.0

    def step_ended(
        self, done: int, held: Callable[[], int], weights: Callable[[], int] | None = None
    ) -> None:
        """Step ``done`` (from 1) has ended."""
        if done == WARMUP:
            self.held = held()
            self.weights = weights() if weights is not None else 0
            self._start = time.perf_counter()
        elif done == WARMUP + self.steps:
            result = {
                "per_step": (time.perf_counter() - self._start) / self.steps,
                "held_bytes": self.held,
                "weights_bytes": self.weights,
                "peak_growth": peak_rss() - self.baseline,
                "cuda_peak_growth": (
                    torch.cuda.max_memory_allocated(self.device) - self.cuda_baseline
                    if self.device is not None
                    else 0
                ),
            }
            self.out.write_text(json.dumps(result), encoding="utf-8")


def _shard_by_hand(layers: nn.Sequential, device_type: str) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for layer in layers:
        if isinstance(layer, Block):
            fully_shard(layer, mesh=mesh)
    fully_shard(layers, mesh=mesh)
    return layers


@dataclass(frozen=True)
class Job:
    """What every rank of a hand-written side is told (it crosses to the ranks pickled)."""

    side: str
    port: int
    width: int
    steps: int
    out: Path
    accelerator: str = "cpu"
    ranks: int = 2

    def join(
        self, rank: int
    ) -> tuple[torch.device, list[tuple[torch.Tensor, torch.Tensor]], Record]:
        """Become ``rank``: its variables, its device (its GPU, made current, on CUDA),
        the batches on it (a data-parallel rank's own: on a 2x2 mesh, its
        tensor-parallel group's), and the record of its figures."""
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port),
                          RANK=str(rank), WORLD_SIZE=str(self.ranks), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(self.ranks))  # fmt: skip
        torch.set_num_threads(1)
        device = torch.device("cpu")
        if self.accelerator == "cuda":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
        reader = 0  # the sharding sections: the same batches on every rank
        if self.side in ("mesh-2x2", "plait-mesh-strategy"):
            reader = rank // 2  # the data-parallel rank
        elif self.side.startswith("mesh-"):
            reader = rank
        data = [(x.to(device), y.to(device)) for x, y in batches(self.width, self.steps, reader)]
        return device, data, Record(self.steps, self.out, device)


Setup = tuple["FSDPStrategy | ModelParallelStrategy | None", nn.Module, torch.optim.Optimizer]


def _through_plait(side: str, accelerator: str, width: int) -> Setup:
    """A plait strategy's side: the strategy, its module and optimizer, set up."""
    strategy: FSDPStrategy | ModelParallelStrategy
    if side == "plait-mesh-strategy":
        strategy = ModelParallelStrategy(
            accelerator=accelerator, data_parallel_size=2, tensor_parallel_size=2
        )
        strategy.setup_environment()
        layers = mesh_model(width)
        mesh = strategy.device_mesh
        split_over(layers, mesh["tp"], mesh["dp_shard"])
    else:
        strategy = FSDPStrategy(accelerator=accelerator, auto_wrap_policy={Block})
        strategy.setup_environment()
        layers = model(width)
    wrapped, [optimizer] = strategy.setup_module_and_optimizers(
        layers, [torch.optim.AdamW(layers.parameters(), lr=1e-3)]
    )
    return strategy, wrapped, optimizer


def _by_hand(side: str, device: torch.device, width: int) -> Setup:
    """A hand-written side: its module, wrapped or split by hand, and optimizer."""
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    layers = (mesh_model if side.startswith("mesh-") else model)(width).to(device)
    wrapped: nn.Module
    if side in ("plain-ddp", "mesh-ddp"):
        wrapped = nn.parallel.DistributedDataParallel(layers)
    elif side == "mesh-2x2":
        from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

        mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))
        split_over(layers, mesh["tp"], mesh["dp"])
        wrapped = layers
    else:
        wrapped = _shard_by_hand(layers, device.type)
    return None, wrapped, torch.optim.AdamW(wrapped.parameters(), lr=1e-3)


def hand_written(rank: int, job: Job) -> None:
    """A hand-written loop on one rank: DDP, FSDP2, a 2x2 mesh, or a plait strategy in it."""
    device, data, record = job.join(rank)
    side = job.side
    strategy, wrapped, optimizer = (
        _through_plait(side, job.accelerator, job.width)
        if side.startswith("plait-")
        else _by_hand(side, device, job.width)
    )
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
                record.step_ended(
                    done,
                    lambda: held_bytes(wrapped, optimizer),
                    lambda: weights_and_optimizer_bytes(wrapped, optimizer),
                )
            optimizer.zero_grad(set_to_none=True)
    if strategy is not None:
        strategy.teardown()
    else:
        dist.destroy_process_group()


class Regression(Module):
    """plait's module for the Trainer sides: ``layers`` regressing the batches' targets."""

    def __init__(self, layers: nn.Sequential) -> None:
        super().__init__()
        self.layers = layers

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
        self.weights = 0

    @override
    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        torch.set_num_threads(1)

    @override
    def on_before_optimizer_step(
        self, trainer: Trainer, module: Module, optimizer: torch.optim.Optimizer
    ) -> None:
        if trainer.global_step + 1 == WARMUP and not isinstance(
            trainer.strategy,
            DeepSpeedStrategy,  # its gradients are the engine's
        ):
            self.held = held_bytes(module, optimizer)  # gradients are there now
            self.weights = weights_and_optimizer_bytes(module, optimizer)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        if trainer.is_global_zero and self.record is not None:
            self.record.step_ended(trainer.global_step, lambda: self.held, lambda: self.weights)


class Engine(Protocol):
    """What the hand-written loop uses of DeepSpeed's engine."""

    optimizer: object

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...
    def backward(self, loss: torch.Tensor) -> object: ...
    def step(self) -> None: ...


def deepspeed_loop(rank: int, job: Job) -> None:
    """A hand-written loop on one rank, on DeepSpeed's engine or DeepSpeedStrategy."""
    from plait.strategies.deepspeed.library import import_deepspeed  # noqa: PLC0415

    side, accelerator, width = job.side, job.accelerator, job.width
    os.environ["DS_ACCELERATOR"] = accelerator
    deepspeed = import_deepspeed(accelerator)  # without the shared-memory op: nothing compiled
    device, data, record = job.join(rank)
    layers = model(width).to(device)
    optimizer = torch.optim.AdamW(layers.parameters(), lr=1e-3)
    if side == "plait-deepspeed-strategy":
        strategy = DeepSpeedStrategy(accelerator=accelerator, stage=2)
        strategy.setup_environment()
        wrapped, _ = strategy.setup_module_and_optimizers(layers, [optimizer])
        engine = strategy.engine
        for done, (x, y) in enumerate(data, start=1):
            prediction = strategy.training_step(wrapped, x)
            assert isinstance(prediction, torch.Tensor)
            strategy.backward(nn.functional.mse_loss(prediction, y), wrapped)
            strategy.optimizer_step(optimizer)
            if rank == 0:
                record.step_ended(
                    done, lambda: 0, lambda: weights_and_optimizer_bytes(layers, engine.optimizer)
                )
        strategy.teardown()
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend)
    deepspeed.init_distributed(dist_backend=backend, dist_init_required=False)
    config: dict[str, object] = dict(DEEPSPEED_CONFIG)
    if side == "plain-deepspeed-3":
        # ZeRO-3, its buckets sized from the model as plait sizes them.
        fitted = sized_buckets(
            {"zero_optimization": {"stage": 3}}, {}, sum(p.numel() for p in layers.parameters())
        )
        config["zero_optimization"] = fitted["zero_optimization"]
    made, *_ = deepspeed.initialize(
        model=layers, optimizer=optimizer, config=config, dist_init_required=False
    )
    hand = cast("Engine", made)
    for done, (x, y) in enumerate(data, start=1):
        loss = nn.functional.mse_loss(hand(x), y)
        hand.backward(loss)
        hand.step()
        if rank == 0:
            record.step_ended(
                done, lambda: 0, lambda: weights_and_optimizer_bytes(layers, hand.optimizer)
            )
    deepspeed.comm.destroy_process_group()


class Weights(Callback):
    """Records, at the warm-up's last step, what the DeepSpeed engine's rank holds."""

    def __init__(self, timing: Timing) -> None:
        self.timing = timing

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        strategy = trainer.strategy
        if trainer.global_step == WARMUP and isinstance(strategy, DeepSpeedStrategy):
            self.timing.weights = weights_and_optimizer_bytes(
                strategy.engine.module, strategy.engine.optimizer
            )


class MeshRegression(Regression):
    """plait's module for the model-parallel Trainer side: it applies the plan itself."""

    @override
    def configure_model(self) -> None:
        mesh = self.device_mesh
        assert mesh is not None
        split_over(self.layers, mesh["tp"], mesh["dp_shard"])


def _trainer_start_method() -> str:
    """How the Trainer sides' launcher starts the other ranks: as a user's job does
    (``popen``: this process is rank 0), or forks where the ranks are forked
    (`tools.two_ranks.start_method`)."""
    return "fork" if two_ranks.start_method() == "fork" else "popen"


def mesh_trainer(width: int, steps: int, out: Path) -> None:
    """plait's Trainer with ModelParallelStrategy on (dp=2, tp=2), 4 gloo ranks."""
    data = batches(width, steps)  # made before the baseline, as every side's are
    timing = Timing(steps, out)
    timing.record = Record(steps, out)
    strategy = ModelParallelStrategy(
        data_parallel_size=2, tensor_parallel_size=2, start_method=_trainer_start_method()
    )
    trainer = _measured_trainer(strategy, "cpu", 4, WARMUP + steps, [timing], out.parent)
    trainer.fit(MeshRegression(mesh_model(width)), data)


def _measured_trainer(  # noqa: PLR0917
    strategy: FSDPStrategy | DeepSpeedStrategy | ModelParallelStrategy,
    accelerator: str,
    devices: int,
    max_steps: int,
    callbacks: list[Callback],
    root: Path,
    deterministic: bool = False,
) -> Trainer:
    """The Trainer of every Trainer side: no logger, progress bar or checkpoint to time.

    Its root is the folder of the figures: where forked ranks trained (the caller
    being none of them), the trained state is saved there.
    """
    return Trainer(
        default_root_dir=root,
        strategy=strategy,
        accelerator=accelerator,
        devices=devices,
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        deterministic=deterministic,
        callbacks=callbacks,
    )


def plait_trainer(  # noqa: PLR0917
    width: int,
    steps: int,
    out: Path,
    stage: int | None = None,
    accelerator: str = "cpu",
    ranks: int = 2,
    deterministic: bool = False,
) -> None:
    """plait's Trainer with FSDPStrategy (or DeepSpeedStrategy at ``stage``), its own
    launcher starting the other ranks."""
    if stage is not None:  # imported by the hand-written side before it measures, too
        from plait.strategies.deepspeed.library import import_deepspeed  # noqa: PLC0415

        import_deepspeed(accelerator)
    data = batches(width, steps)  # made before the baseline, as every side's are
    timing = Timing(steps, out)
    # Before the model is built; rank 0 (this process) uses the first GPU.
    device = torch.device("cuda", 0) if accelerator == "cuda" else None
    timing.record = Record(steps, out, device)
    start_method = _trainer_start_method()
    strategy = (
        FSDPStrategy(auto_wrap_policy={Block}, start_method=start_method)
        if stage is None
        else DeepSpeedStrategy(stage=stage, start_method=start_method)
    )
    callbacks: list[Callback] = [Weights(timing), timing]
    trainer = _measured_trainer(
        strategy, accelerator, ranks, WARMUP + steps, callbacks, out.parent, deterministic
    )
    trainer.fit(Regression(model(width)), data)


def rank_main(rank: int, job: Job) -> None:
    """One spawned rank of a hand-written side: its loop, then the end of the process.

    After a loop that finished and destroyed its group, the rank leaves without tearing
    the interpreter down (`plait.strategies.job.leave`): gloo's worker threads can abort
    a finalizing interpreter (``terminate called without an active exception``), about
    one ZeRO-3 run in three on 2 cores, which spawn reports as the side failing. An
    error in the loop propagates as usual and fails the side.
    """
    loop = deepspeed_loop if job.side in DEEPSPEED_SIDES else hand_written
    loop(rank, job)
    leave(0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def main(argv: list[str] | None = None) -> int:
    """Run one side on its ranks; rank 0 writes its figures to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--ranks", type=int, default=2, help="processes (one per GPU on cuda)")
    args = parser.parse_args(argv)
    if args.accelerator == "cuda" and torch.cuda.device_count() < args.ranks:
        parser.error(
            f"--ranks {args.ranks} needs as many GPUs: this machine has "
            f"{torch.cuda.device_count()}; pass --ranks {max(1, torch.cuda.device_count())}"
        )
    where = (args.accelerator, args.ranks)
    if args.side in MESH_SIDES and (args.ranks, args.accelerator) != (4, "cpu"):
        parser.error(f"--side {args.side} runs on 4 gloo ranks: pass --ranks 4")
    if args.side == "plait-mesh-trainer":
        mesh_trainer(args.width, args.steps, args.out)
    elif args.side == "plait-trainer":
        plait_trainer(args.width, args.steps, args.out, None, *where)
    elif args.side.startswith("plait-deepspeed-") and args.side[-1].isdigit():
        plait_trainer(args.width, args.steps, args.out, int(args.side[-1]), *where)
    elif args.side == "plait-deepspeed-2-deterministic":
        plait_trainer(args.width, args.steps, args.out, 2, *where, deterministic=True)
    else:
        from torch.multiprocessing.spawn import start_processes  # noqa: PLC0415

        job = Job(args.side, _free_port(), args.width, args.steps, args.out, *where)
        start_processes(  # type: ignore[no-untyped-call]
            rank_main, (job,), nprocs=args.ranks, start_method=two_ranks.start_method()
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
