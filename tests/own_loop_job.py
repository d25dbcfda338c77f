"""A platform team's own training loop, written once against the Strategy contract.

    python own_loop_job.py ROOT STRATEGY [STRATEGY ...]

Only the line that builds the strategy differs between strategies. For each one the
loop runs three times, each in ranks launched afresh (two processes on gloo; one
for ``single_device``):

- ``full``: STEPS optimizer steps, each over two micro-batches whose first backward
  runs inside ``no_sync``; it saves the model, optimizer, scheduler and step after
  step SAVE_AT and at the end;
- ``resumed``: loads the SAVE_AT checkpoint into a freshly built loop (one
  ``load_checkpoint`` call, which must leave nothing over), trains on to STEPS and
  saves again;
- ``big``: the same steps over one batch of twice the size, without ``no_sync``.

It writes ``ROOT/STRATEGY.json``: each run's mean loss by step (averaged over the
ranks with the strategy's ``reduce``) and what ``load_checkpoint`` returned.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

from plait.core import Strategy, StrategyRegistry, seed_everything
from plait.strategies.launchers import MultiprocessingLauncher

STEPS = 8
SAVE_AT = 4
MICRO_BATCH = 4
WORLD_SIZE = 2


def make_strategy(name: str) -> Strategy:
    """The one line a team changes to move its loop to another strategy."""
    return StrategyRegistry.get(name, accelerator="cpu")


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's samples of a step: the same, whichever run asks."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    inputs = torch.randn(size, 6, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(
        size, 1, generator=generator
    )
    return inputs, targets


def run(name: str, root: str, mode: str) -> dict[str, object]:
    """One rank's loop; rank 0's losses by step and what loading left over."""
    seed_everything(0)
    strategy = make_strategy(name)
    strategy.setup_environment()
    layers = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    model, [optimizer] = strategy.setup_module_and_optimizers(
        layers, [torch.optim.AdamW(layers.parameters(), lr=0.02)]
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    state: dict[str, object] = {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "step": 0,
    }
    left: dict[str, object] | None = None
    if mode == "resumed":
        left = dict(strategy.load_checkpoint(Path(root) / f"{name}-step{SAVE_AT}", state))
    rank = strategy.global_rank
    losses: dict[str, float] = {}
    start = state["step"]
    assert isinstance(start, int)
    for step in range(start, STEPS):
        inputs, targets = batch(step, rank, 2 * MICRO_BATCH)
        pieces = 1 if mode == "big" else 2
        total = 0.0
        for index, (x, y) in enumerate(
            zip(inputs.chunk(pieces), targets.chunk(pieces), strict=True)
        ):
            with strategy.no_sync(model, enabled=index < pieces - 1):
                prediction = strategy.training_step(model, x)
                assert isinstance(prediction, torch.Tensor)
                loss = nn.functional.mse_loss(prediction.float(), y) / pieces
                strategy.backward(loss, model)
            total += loss.item()
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        scheduler.step()
        losses[str(step + 1)] = float(strategy.reduce(torch.tensor(total), reduce_op="mean"))
        state["step"] = step + 1
        if mode != "big" and step + 1 in {SAVE_AT, STEPS}:
            strategy.save_checkpoint(state, Path(root) / f"{name}-{mode}-step{step + 1}")
            if mode == "full" and step + 1 == SAVE_AT:
                strategy.save_checkpoint(state, Path(root) / f"{name}-step{SAVE_AT}")
    strategy.teardown()
    return {"losses": losses, "left": None if left is None else sorted(left)}


def main() -> None:
    """Every run of every strategy named, each in ranks of its own."""
    root, names = sys.argv[1], sys.argv[2:]
    # Imported once here, the forked ranks find them loaded (seconds of each rank's
    # start): FSDP's and checkpointing's modules, and DeepSpeed with the
    # torch._dynamo its engine imports at set-up.
    import torch.distributed.checkpoint  # noqa: PLC0415
    import torch.distributed.fsdp  # noqa: PLC0415

    if any(name.startswith("deepspeed") for name in names):
        import torch._dynamo  # noqa: F401, PLC0415

        from plait.strategies.deepspeed.library import import_deepspeed  # noqa: PLC0415

        import_deepspeed("cpu")
    for name in names:
        results = {}
        for mode in ("full", "resumed", "big"):
            if name == "single_device":
                results[mode] = run(name, root, mode)
            else:
                launcher = MultiprocessingLauncher(WORLD_SIZE, start_method="fork")
                results[mode] = launcher.launch(run, name, root, mode)
        (Path(root) / f"{name}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
