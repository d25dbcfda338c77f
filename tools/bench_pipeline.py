"""A pipeline over 2 gloo ranks: plait's `Pipeline` against torch's schedule built by hand.

    python tools/bench_pipeline.py --steps N --rounds R --out FILE [--schedule NAME]

A stack of MLP blocks split in two stages (one per rank), a batch of 32 in 4
microbatches, AdamW. A step is the schedule's forward and backward, then the
optimizer's step:

- ``plait``: ``ModelParallelStrategy(pipeline_parallel_size=2)``,
  ``strategy.pipeline(model, loss_fn, units=...)``, ``pipeline.step(x, target=y)``
  (which also gives the loss to both ranks) and ``strategy.optimizer_step``;
- ``hand``: the same split written by hand (a copy of the model per rank with the
  other stage's blocks removed), ``PipelineStage`` and the schedule class made
  directly on the same process group, ``schedule.step`` and ``optimizer.step``.

Both are checked to give the same losses first. The sides take turns within each
round (the first round warms up and is dropped); rank 0 writes the seconds per step
of each side, a list over rounds, to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

# Run as a script: the repository root holds the ``tools`` package its helper is in.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import two_ranks

WIDTH, DEPTH, BATCH, MICROBATCHES = 256, 8, 32, 4


def _rank(rank: int, port: int, args: argparse.Namespace) -> None:  # noqa: PLR0915
    two_ranks.join_as(rank, port)
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415
    from torch.distributed.pipelining import PipelineStage  # noqa: PLC0415
    from torch.distributed.pipelining.schedules import get_schedule_class  # noqa: PLC0415
    from typing_extensions import override  # noqa: PLC0415

    from plait.strategies import ModelParallelStrategy  # noqa: PLC0415

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleDict({
                str(i): nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for i in range(DEPTH)
            })  # fmt: skip

        @override
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            for layer in self.layers.values():
                if layer is not None:
                    h = layer(h)
            return h

    torch.set_num_threads(1)  # two ranks on a machine of few cores: one thread each
    strategy = ModelParallelStrategy(
        pipeline_parallel_size=2,
        data_parallel_size=1,
        tensor_parallel_size=1,
        pipeline_schedule=args.schedule,
        pipeline_microbatches=MICROBATCHES,
        accelerator="cpu",
        timeout=timedelta(minutes=2),
    )
    strategy.setup_environment()
    group = strategy.pipeline_group
    assert group is not None
    loss_fn = nn.functional.mse_loss
    units = [f"layers.{i}" for i in range(DEPTH)]

    torch.manual_seed(0)
    whole = Stack()
    pipeline = strategy.pipeline(copy.deepcopy(whole), loss_fn, units=units)
    strategy.setup_module(pipeline)
    [plait_optimizer] = strategy.setup_optimizers([torch.optim.AdamW(pipeline.parameters())])

    # By hand: this rank's half of the blocks, removed from a copy of the whole model.
    part = copy.deepcopy(whole)
    stages = len(pipeline.stages) * 2
    owned = pipeline.stages
    for index in range(DEPTH):
        if index * stages // DEPTH not in owned:
            part.layers.register_module(str(index), None)
    local = [part] if len(owned) == 1 else [copy.deepcopy(part) for _ in owned]
    if len(owned) > 1:  # looped schedules: one copy per stage, each its own blocks
        for copy_, stage in zip(local, owned, strict=True):
            for index in range(DEPTH):
                if index * stages // DEPTH != stage:
                    copy_.layers.register_module(str(index), None)
    hand_stages = [
        PipelineStage(module, stage, stages, torch.device("cpu"), group=group)
        for module, stage in zip(local, owned, strict=True)
    ]
    schedule_class = get_schedule_class(args.schedule)
    schedule = (
        schedule_class(hand_stages[0], MICROBATCHES, loss_fn=loss_fn, scale_grads=True)
        if len(hand_stages) == 1
        else schedule_class(hand_stages, MICROBATCHES, loss_fn=loss_fn, scale_grads=True)
    )
    hand_optimizer = torch.optim.AdamW([p for m in local for p in m.parameters()])
    first, last = pipeline.has_first_stage, pipeline.has_last_stage

    generator = torch.Generator().manual_seed(1)
    x, y = (
        torch.randn(BATCH, WIDTH, generator=generator),
        torch.randn(BATCH, WIDTH, generator=generator),
    )

    def plait() -> float:
        loss = pipeline.step(x, target=y)
        strategy.optimizer_step(plait_optimizer)
        strategy.zero_grad(plait_optimizer)
        return float(loss)

    def hand() -> float:
        losses: list[torch.Tensor] = []
        schedule.step(*((x,) if first else ()), target=y if last else None,
                      losses=losses if last else None)  # fmt: skip
        hand_optimizer.step()
        hand_optimizer.zero_grad(set_to_none=True)
        return float(torch.stack(losses).detach().mean()) if last else float("nan")

    sides: dict[str, Callable[[], float]] = {"plait": plait, "hand": hand}
    mine, theirs = plait(), hand()
    if last:
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)

    results = two_ranks.time_sides(
        sides, rounds=args.rounds, steps=args.steps, barrier=lambda: dist.barrier(group=group)
    )
    two_ranks.write(rank, args.out, results)
    strategy.teardown()


def main() -> None:
    """Start the two ranks; fail if either does."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--schedule", default="1F1B", help="a torch schedule's name")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    two_ranks.start(_rank, args, "pipeline")


if __name__ == "__main__":
    main()
