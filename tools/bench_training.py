"""Training workloads that tools/bench times: the same MLP trained by each side.

    python tools/bench_training.py steps --width 32 --steps 300 --rounds 5 --sides plain,trainer
    python tools/bench_training.py ddp --side plait-ddp --width 256 --steps 300 --out result.json
    python tools/bench_training.py profile --width 32 --steps 200 --sides plain-memory,plait-trainer

``steps`` trains on one process, every side in turn, round after round, and prints
the seconds per step of each side and round as JSON. ``ddp`` runs one side on two
gloo processes (starting them as that side does) and rank 0 writes the wall-clock
time its first step ended and the seconds per step to ``--out``; tools/bench knows
when it started the command, and so the launch-to-first-step time. ``profile``
counts what one step of each side calls (`profile_steps`), and prints it as JSON.

Every side trains the same model (an MLP of 32 inputs, two hidden layers of
``--width`` and 10 classes) on the same batches of 64 from a DataLoader, with SGD;
the ``-memory`` sides take the same batches from a list made beforehand, so that
no loader's cost dilutes the framework's own.
Seconds per step are taken in the steady state: from the end of step `WARMUP` to
the end of step ``WARMUP + steps``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import json
import pstats
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Final, TypeAlias, TypedDict

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from typing_extensions import override

from plait.strategies import SingleDeviceStrategy
from plait.trainer import Callback, Module, Trainer

WARMUP: Final = 30
BATCH: Final = 64
FEATURES: Final = 32
CLASSES: Final = 10
LR: Final = 0.01

Batch: TypeAlias = Sequence[torch.Tensor]


def lightning_installed() -> bool:
    """Whether Lightning's Trainer can be imported here."""
    try:
        return importlib.util.find_spec("lightning.pytorch") is not None
    except ModuleNotFoundError:  # no lightning package at all
        return False


def mlp(width: int) -> nn.Sequential:
    """The model every side trains."""
    return nn.Sequential(
        nn.Linear(FEATURES, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, CLASSES),
    )


def dataset(steps: int, ranks: int = 1) -> TensorDataset:
    """Enough samples for ``WARMUP + steps`` batches on each of ``ranks`` ranks."""
    generator = torch.Generator().manual_seed(0)
    samples = BATCH * ranks * (WARMUP + steps)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(inputs, torch.randint(CLASSES, (samples,), generator=generator))


def loader(steps: int, ranks: int = 1) -> DataLoader[tuple[torch.Tensor, ...]]:
    """The shuffled batches every side trains on (a Trainer shards them over ranks)."""
    return DataLoader(dataset(steps, ranks), batch_size=BATCH, shuffle=True)


def in_memory(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same batches made beforehand, as a list: no loader's cost in the step."""
    inputs, targets = dataset(steps).tensors
    return [
        (inputs[start : start + BATCH], targets[start : start + BATCH])
        for start in range(0, len(inputs), BATCH)
    ]


class Clock:
    """The steady-state seconds per step, from the step ends it is told of."""

    def __init__(self, steps: int, out: Path | None = None) -> None:
        self.steps = steps
        self.out = out  # where to write the times once the last step has ended
        self.first_end = 0.0  # wall-clock time (time.time) at the end of step 1
        self._start = 0.0
        self.per_step = 0.0

    def step_ended(self, done: int) -> None:
        """Step number ``done`` (from 1) has ended."""
        if done == 1:
            self.first_end = time.time()
        if done == WARMUP:
            self._start = time.perf_counter()
        elif done == WARMUP + self.steps:
            self.per_step = (time.perf_counter() - self._start) / self.steps
            if self.out is not None:
                result = {"first_step_end": self.first_end, "per_step": self.per_step}
                self.out.write_text(json.dumps(result), encoding="utf-8")


def _loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.cross_entropy(model(inputs), targets)


# One process.


def plain_loop(width: int, steps: int) -> float:
    """A hand-written PyTorch loop."""
    torch.manual_seed(0)
    model = mlp(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    clock = Clock(steps)
    for done, batch in enumerate(loader(steps), start=1):
        optimizer.zero_grad()
        torch.autograd.backward(_loss(model, batch))  # loss.backward(), typed
        optimizer.step()
        clock.step_ended(done)
    return clock.per_step


def plain_memory_loop(width: int, steps: int) -> float:
    """A hand-written PyTorch loop over batches made beforehand."""
    torch.manual_seed(0)
    model = mlp(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    clock = Clock(steps)
    for done, batch in enumerate(in_memory(steps), start=1):
        optimizer.zero_grad()
        torch.autograd.backward(_loss(model, batch))
        optimizer.step()
        clock.step_ended(done)
    return clock.per_step


def plait_strategy_loop(width: int, steps: int) -> float:
    """The hand-written loop, with plait's single-device strategy doing its part."""
    torch.manual_seed(0)
    strategy = SingleDeviceStrategy("cpu")
    layers = mlp(width)
    model, [optimizer] = strategy.setup(layers, [torch.optim.SGD(layers.parameters(), lr=LR)])
    clock = Clock(steps)
    for done, batch in enumerate(loader(steps), start=1):
        optimizer.zero_grad()
        loss = _loss(model, batch)
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer)
        clock.step_ended(done)
    strategy.teardown()
    return clock.per_step


class Classifier(Module):
    """The MLP as a plait Module, logging its loss at every step when asked."""

    def __init__(self, width: int, log: bool = False) -> None:
        super().__init__()
        self.net = mlp(width)
        self.log_loss = log

    @override
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(inputs)
        return out

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list | tuple)
        loss = _loss(self.net, batch)
        if self.log_loss:
            self.log("loss", loss)
        return loss

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


class ManualClassifier(Classifier):
    """The MLP stepping its optimizer itself (manual optimization), as the plain loop does."""

    def __init__(self, width: int) -> None:
        super().__init__(width)
        self.automatic_optimization = False

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list | tuple)
        optimizer = self.optimizers()
        assert not isinstance(optimizer, list)
        optimizer.zero_grad()
        loss = _loss(self.net, batch)
        self.manual_backward(loss)
        optimizer.step()
        return loss


class Timing(Callback):
    """Tells a Clock of each training step's end (on rank 0).

    Which rank it runs on is read once, at the fit's start: per step it costs what
    the plain loop's call to the clock costs, a call and a count.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.zero = False

    @override
    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        self.zero = trainer.is_global_zero

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        if self.zero:
            self.clock.step_ended(trainer.global_step)


class TrainerOptions(TypedDict):
    """What plait's and Lightning's Trainers are both given."""

    accelerator: str
    strategy: str
    devices: int
    logger: bool
    enable_progress_bar: bool
    enable_checkpointing: bool
    max_steps: int


def _trainer_options(steps: int, strategy: str, devices: int) -> TrainerOptions:
    # No progress bar, logger or checkpoints; the warm-up and the timed steps.
    return {
        "accelerator": "cpu",
        "strategy": strategy,
        "devices": devices,
        "logger": False,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "max_steps": WARMUP + steps,
    }


def plait_trainer(
    width: int,
    steps: int,
    *,
    log: bool = False,
    strategy: str = "auto",
    devices: int = 1,
    out: Path | None = None,
    memory: bool = False,
    manual: bool = False,
) -> Clock:
    """plait's Trainer, with no progress bar, logger or checkpoints.

    With ``memory``, it trains on the batches made beforehand (`in_memory`), so that
    the time per step is the framework's own cost over the plain loop's; with
    ``manual``, the module steps its optimizer itself (`ManualClassifier`).
    """
    torch.manual_seed(0)
    clock = Clock(steps, out)
    trainer = Trainer(
        **_trainer_options(steps, strategy, devices),
        callbacks=[Timing(clock)],
    )
    data = in_memory(steps) if memory else loader(steps, devices)
    trainer.fit(ManualClassifier(width) if manual else Classifier(width, log=log), data)
    return clock


def lightning_trainer(
    width: int,
    steps: int,
    *,
    log: bool = False,
    strategy: str = "auto",
    devices: int = 1,
    out: Path | None = None,
) -> Clock:
    """Lightning's Trainer, set up as plait's is (only where Lightning is installed)."""
    import lightning.pytorch as pl  # noqa: PLC0415 - an optional comparison

    class LightningClassifier(pl.LightningModule):  # type: ignore[misc] # untyped here
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(width)

        def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
            loss = _loss(self.net, batch)
            if log:
                self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=LR)

    clock = Clock(steps, out)

    class LightningTiming(pl.Callback):  # type: ignore[misc] # untyped here
        def on_train_batch_end(self, trainer: pl.Trainer, *_: object) -> None:
            if trainer.is_global_zero:
                clock.step_ended(trainer.global_step)

    torch.manual_seed(0)
    trainer = pl.Trainer(
        **_trainer_options(steps, strategy, devices),
        enable_model_summary=False,
        callbacks=[LightningTiming()],
    )
    trainer.fit(LightningClassifier(), loader(steps, devices))
    return clock


STEP_SIDES: Final[dict[str, Callable[[int, int], float]]] = {
    "plain": plain_loop,
    "plait-strategy": plait_strategy_loop,
    "plait-trainer": lambda width, steps: plait_trainer(width, steps).per_step,
    "plait-trainer-log": lambda width, steps: plait_trainer(width, steps, log=True).per_step,
    "plain-memory": plain_memory_loop,
    "plait-trainer-memory": lambda width, steps: plait_trainer(width, steps, memory=True).per_step,
    "plait-trainer-manual-memory": lambda width, steps: (
        plait_trainer(width, steps, memory=True, manual=True).per_step
    ),
    "lightning": lambda width, steps: lightning_trainer(width, steps).per_step,
    "lightning-log": lambda width, steps: lightning_trainer(width, steps, log=True).per_step,
}


def run_steps(width: int, steps: int, rounds: int, sides: Sequence[str]) -> dict[str, list[float]]:
    """Seconds per step of each side, one value per round; the sides take turns."""
    torch.set_num_threads(1)
    for side in sides:  # warm up: first calls pay for lazy imports and allocations
        STEP_SIDES[side](width, min(steps, 20))
    results: dict[str, list[float]] = {side: [] for side in sides}
    for index in range(rounds):
        shift = index % len(sides)  # each round starts with another side
        for side in [*sides[shift:], *sides[:shift]]:
            results[side].append(STEP_SIDES[side](width, steps))
    return results


class StepProfile(TypedDict):
    """What one step of a side calls, counted by `profile_steps`."""

    calls: float
    """Python calls (functions, methods, builtins) one step makes."""
    plait: list[tuple[str, float]]
    """plait's own functions one step calls, with how many times, most called first."""


def _calls(side: str, width: int, steps: int) -> dict[str, int]:
    profile = cProfile.Profile()
    profile.enable()
    STEP_SIDES[side](width, steps)
    profile.disable()
    stats: dict[tuple[str, int, str], tuple[int, ...]] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return {f"{path}:{line}({name})": counts[1] for (path, line, name), counts in stats.items()}


def profile_steps(width: int, steps: int, sides: Sequence[str]) -> dict[str, StepProfile]:
    """What one step of each side calls: counted over ``steps`` and ``2 * steps``.

    A run's set-up and end call the same whatever its length: the difference between
    a run of ``2 * steps`` and one of ``steps``, over ``steps``, is what a step calls.
    Counts, not times, so a busy machine gives the same figures.
    """
    torch.set_num_threads(1)
    profiles: dict[str, StepProfile] = {}
    for side in sides:
        STEP_SIDES[side](width, min(steps, 20))  # lazy imports and first calls
        short, long = _calls(side, width, steps), _calls(side, width, 2 * steps)
        per_step = {name: (count - short.get(name, 0)) / steps for name, count in long.items()}
        plait = sorted(
            (
                (name.split("/src/", 1)[-1], calls)
                for name, calls in per_step.items()
                if "/src/plait/" in name and calls >= 0.5
            ),
            key=lambda item: (-item[1], item[0]),
        )
        profiles[side] = {"calls": sum(per_step.values()), "plait": plait}
    return profiles


# Two processes.


def _plain_ddp_rank(width: int, steps: int, out: Path) -> None:
    """One rank of a hand-written DDP loop; the process group is already up."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DistributedDataParallel(mlp(width))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    data = dataset(steps, dist.get_world_size())
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(data)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    clock = Clock(steps, out if dist.get_rank() == 0 else None)
    for done, batch in enumerate(loader, start=1):
        optimizer.zero_grad()
        torch.autograd.backward(_loss(model, batch))  # loss.backward(), typed
        optimizer.step()
        clock.step_ended(done)
    # DDP's reducer holds the group: collected first, the group's destruction joins
    # gloo's worker threads; left to the interpreter's exit, a worker freeing the
    # last collective's work may take the GIL during finalization and abort.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


def _spawned_rank(rank: int, init: str, width: int, steps: int, out: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(minutes=2)
    )
    _plain_ddp_rank(width, steps, out)


def run_ddp(side: str, width: int, steps: int, out: Path) -> None:
    """Run ``side`` on two gloo processes; rank 0 writes its times to ``out``."""
    if side == "plain-mp":
        from torch.multiprocessing.spawn import spawn  # noqa: PLC0415

        from plait.core.network import free_port  # noqa: PLC0415

        init = f"tcp://127.0.0.1:{free_port()}"
        spawn(_spawned_rank, (init, width, steps, out), nprocs=2)  # type: ignore[no-untyped-call]
    elif side == "plain-torchrun-rank":  # torchrun started this process and set its env
        dist.init_process_group("gloo", timeout=timedelta(minutes=2))
        _plain_ddp_rank(width, steps, out)
    elif side in ("plait-ddp", "plait-ddp-spawn", "lightning-ddp"):
        torch.set_num_threads(1)
        strategy = side.removeprefix("plait-").removeprefix("lightning-").replace("-", "_")
        run = lightning_trainer if side.startswith("lightning") else plait_trainer
        run(width, steps, strategy=strategy, devices=2, out=out)
    else:
        raise ValueError(f"unknown side {side!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workload the command line names."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("workload", choices=("steps", "ddp", "profile"))
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300, help="steps timed per run")
    parser.add_argument("--rounds", type=int, default=5, help="steps: runs per side")
    parser.add_argument(
        "--sides", default="plain,plait-trainer", help="steps, profile: comma-separated"
    )
    parser.add_argument("--side", default="plain-mp", help="ddp: the side to run")
    parser.add_argument("--out", type=Path, help="ddp: where rank 0 writes its times")
    args = parser.parse_args(argv)
    if args.workload in ("steps", "profile"):
        sides = args.sides.split(",")
        unknown = [side for side in sides if side not in STEP_SIDES]
        if unknown:
            parser.error(f"unknown sides {unknown}: choose from {', '.join(STEP_SIDES)}")
        if any(side.startswith("lightning") for side in sides) and not lightning_installed():
            parser.error("the lightning sides need lightning: run tools/bench --with-lightning")
        if args.workload == "profile":
            print(json.dumps(profile_steps(args.width, args.steps, sides)))
        else:
            print(json.dumps(run_steps(args.width, args.steps, args.rounds, sides)))
    else:
        if args.out is None:
            parser.error("ddp needs --out")
        if args.side.startswith("lightning") and not lightning_installed():
            parser.error("the lightning sides need lightning: run tools/bench --with-lightning")
        run_ddp(args.side, args.width, args.steps, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
