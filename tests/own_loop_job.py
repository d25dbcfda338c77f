"""A platform team's own training loop, written once against the Strategy contract.

    python own_loop_job.py ROOT STRATEGY [STRATEGY ...]

Only the line that builds the strategy differs between strategies. For each one the
loop runs three times (two processes on gloo; this process for ``single_device`` and
for XLA on one XLA:CPU device), the resumed run in ranks launched afresh:

- ``full``: STEPS optimizer steps, each over two micro-batches whose first backward
  runs inside ``no_sync``; it saves the model, optimizer, scheduler and step after
  step SAVE_AT and at the end;
- ``resumed``: loads the SAVE_AT checkpoint into a freshly built loop (one
  ``load_checkpoint`` call, which must leave nothing over), trains on to STEPS and
  saves again;
- ``big``: the same steps over one batch of twice the size, without ``no_sync``, in
  the ranks of ``full``, after it, on a strategy made anew (a second run in one
  program).

and then, for each ``--move SOURCE:TARGET`` (``SOURCE:TARGET:weights``):

- ``moved``: TARGET loads SOURCE's SAVE_AT checkpoint (with ``weights_only=True``:
  the weights, the scheduler and the step, and a fresh optimizer) and trains on to
  STEPS.

At the end of ``full`` every rank calls ``export_checkpoint`` (one file), and the
launching process consolidates the STEPS checkpoint (``consolidate_checkpoint``).

It writes ``ROOT/STRATEGY.json`` (and ``ROOT/TARGET-moved-from-SOURCE.json``,
``ROOT/TARGET-weights-from-SOURCE.json``): each run's mean loss by step (averaged
over the ranks with the strategy's ``reduce``) and what ``load_checkpoint``
returned.
"""

from __future__ import annotations

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import argparse
import importlib
import json
from pathlib import Path

import torch
from torch import nn

from plait.core import ConfigurationError, Strategy, StrategyRegistry, seed_everything
from plait.strategies import BaseStrategy, consolidate_checkpoint
from plait.strategies.launchers import MultiprocessingLauncher

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()

STEPS = 8
SAVE_AT = 4
MICRO_BATCH = 4
JSON = "json"
"""The source of a move from a checkpoint of the example plugin's format (``example_json``)."""
WORLD_SIZE = 2
# Strategies of one process here: one device, and XLA on one XLA:CPU device.
IN_PROCESS = frozenset({"single_device", "single_xla", "xla"})


def make_strategy(name: str) -> Strategy:
    """The one line a team changes to move its loop to another strategy."""
    if "xla" in name:
        return StrategyRegistry.get(name)  # on the XLA device (XLA:CPU here)
    if name == "deepspeed_stage_0":  # DeepSpeed's engine, partitioning nothing
        return StrategyRegistry.get("deepspeed", accelerator="cpu", stage=0)
    return StrategyRegistry.get(name, accelerator="cpu")


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's samples of a step: the same, whichever run asks."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    inputs = torch.randn(size, 6, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(
        size, 1, generator=generator
    )
    return inputs, targets


def optimizer_fingerprint(optimizer: torch.optim.Optimizer) -> list[float]:
    """This rank's optimizer state as numbers: one per tensor (its shard, if sharded)."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    numbers = []
    for state in optimizer.state.values():
        for key in sorted(state):
            value = state[key]
            if isinstance(value, torch.Tensor):
                local = value.to_local() if isinstance(value, DTensor) else value
                numbers.append(float(local.double().abs().sum()))
    return numbers


def probe(strategy: Strategy, model: nn.Module) -> float:
    """The module's output on a fixed input, summed over the ranks: which weights it holds."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, generator=generator).to(strategy.root_device)
    output = strategy.validation_step(model, x)
    assert isinstance(output, torch.Tensor)
    return float(strategy.reduce(output.float().sum(), reduce_op="sum"))


def gradient_norm(
    strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer
) -> float | str:
    """Fabric's ``clip_gradients_norm`` with a bound no gradient reaches: the total norm."""
    assert isinstance(strategy, BaseStrategy)
    try:
        return float(strategy.clip_gradients_norm(model, optimizer, max_norm=1e9))
    except ConfigurationError:  # DeepSpeed's engine clips inside its step
        return "refused"


def loads_bare_state(strategy: Strategy, model: nn.Module, root: str, name: str) -> list[float]:
    """A file of a module's bare ``state_dict()`` (Fabric's ``load_raw``), loaded into ``model``.

    The exported weights doubled, saved as ``torch.save(state_dict)`` writes them; the
    probe of the loaded model, and what a plain module holding them gives (times the
    ranks the probe sums over).
    """
    bare = Path(root) / f"{name}-bare.pt"
    plain = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    exported = torch.load(Path(root) / f"{name}-export.pt")["state_dict"]
    plain.load_state_dict({key: 2 * value for key, value in exported.items()})
    if strategy.is_global_zero:
        torch.save(plain.state_dict(), bare)
    strategy.barrier("bare state written")
    strategy.load_checkpoint(bare, model)
    generator = torch.Generator().manual_seed(1)
    expected = float(plain(torch.randn(4, 6, generator=generator)).sum()) * strategy.world_size
    return [probe(strategy, model), expected]


def run(name: str, root: str, mode: str, source: str | None = None) -> dict[str, object]:
    """One rank's loop: the mean losses by step, and what loading left over."""
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
    alone: dict[str, object] = {}
    if mode == "resumed":
        path = Path(root) / f"{name}-step{SAVE_AT}"
        # The module alone first: restored in place, every optimizer left as it was,
        # and the run's entries given back, the same on every strategy.
        before = optimizer_fingerprint(optimizer)
        alone["left"] = sorted(strategy.load_checkpoint(path, model))
        alone["untouched"] = optimizer_fingerprint(optimizer) == before
        alone_output = probe(strategy, model)
        left = dict(strategy.load_checkpoint(path, state))
        alone["module"] = probe(strategy, model) == alone_output
    elif mode in {"moved", "weights"}:
        assert source is not None
        path = Path(root) / f"{source}-step{SAVE_AT}"
        left = dict(strategy.load_checkpoint(path, state, weights_only=mode == "weights"))
    rank = strategy.global_rank
    losses: dict[str, float] = {}
    norms: dict[str, float | str] = {}
    start = state["step"]
    assert isinstance(start, int)
    # One process trains on every rank's samples: the same run as two ranks' (the
    # mean over all of them), so that checkpoints move between world sizes too.
    ranks = [rank] if strategy.world_size > 1 else list(range(WORLD_SIZE))
    for step in range(start, STEPS):
        pieces = 1 if mode == "big" else 2
        parts = [batch(step, r, 2 * MICRO_BATCH) for r in ranks]
        micro = [
            (
                torch.cat([x.chunk(pieces)[i] for x, _ in parts]),
                torch.cat([y.chunk(pieces)[i] for _, y in parts]),
            )
            for i in range(pieces)
        ]
        total = 0.0
        device = strategy.root_device  # an XLA device, or the CPU
        for index, (x, y) in enumerate((x.to(device), y.to(device)) for x, y in micro):
            with strategy.no_sync(model, enabled=index < pieces - 1):
                prediction = strategy.training_step(model, x)
                assert isinstance(prediction, torch.Tensor)
                loss = nn.functional.mse_loss(prediction.float(), y) / pieces
                strategy.backward(loss, model)
            total += loss.item()
        if mode == "big":
            norms[str(step + 1)] = gradient_norm(strategy, model, optimizer)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        scheduler.step()
        losses[str(step + 1)] = float(strategy.reduce(torch.tensor(total), reduce_op="mean"))
        state["step"] = step + 1
        if mode != "big" and step + 1 in {SAVE_AT, STEPS}:
            strategy.save_checkpoint(state, Path(root) / f"{name}-{mode}-step{step + 1}")
            if mode == "full" and step + 1 == SAVE_AT:
                strategy.save_checkpoint(state, Path(root) / f"{name}-step{SAVE_AT}")
    bare: list[float] = []
    if mode == "full":
        strategy.export_checkpoint(model, Path(root) / f"{name}-export.pt")
        bare = loads_bare_state(strategy, model, root, name)
    strategy.teardown()
    return {
        "losses": losses,
        "left": None if left is None else sorted(left),
        "alone": alone,
        "norms": norms,
        "bare": bare,
    }


def runs(name: str, root: str, modes: tuple[str, ...], source: str | None) -> list[object]:
    """The loop's ``modes`` one after another in the same ranks, each on a strategy anew."""
    return [run(name, root, mode, source) for mode in modes]


def launch(name: str, root: str, modes: tuple[str, ...], source: str | None = None) -> list[object]:
    """Run ``modes`` of the loop in ranks of their own (in this process, for one device)."""
    if name in IN_PROCESS:
        return runs(name, root, modes, source)
    launcher = MultiprocessingLauncher(WORLD_SIZE, start_method="fork")
    return launcher.launch(runs, name, root, modes, source)


def main() -> None:
    """Every run of every strategy named, each in ranks of its own; then the moves."""
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("strategies", nargs="+")
    parser.add_argument("--move", action="append", default=[], help="SOURCE:TARGET[:weights]")
    options = parser.parse_args()
    root: str = options.root
    names: list[str] = options.strategies
    # Imported once here, the forked ranks find them loaded (seconds of each rank's
    # start): FSDP's and checkpointing's modules, and DeepSpeed with the
    # torch._dynamo its engine imports at set-up.
    import torch.distributed.checkpoint  # noqa: PLC0415
    import torch.distributed.fsdp  # noqa: PLC0415

    if any("xla" in name for name in names):
        # Before any backward: autograd's engine sizes its device queues at its first
        # backward, and an XLA device registered after that is not among them.
        importlib.import_module("torch_xla").device()
    if any(name.startswith("deepspeed") for name in names):
        import torch._dynamo  # noqa: PLC0415

        from plait.strategies.deepspeed.library import import_deepspeed  # noqa: PLC0415

        import_deepspeed("cpu")
    for name in names:
        # The uninterrupted run, then (a second strategy in the same ranks) the big batch;
        # the resumed run in ranks launched afresh.
        full, big = launch(name, root, ("full", "big"))
        [resumed] = launch(name, root, ("resumed",))
        results = {"full": full, "resumed": resumed, "big": big}
        (Path(root) / f"{name}.json").write_text(json.dumps(results))
        consolidate_checkpoint(
            Path(root) / f"{name}-full-step{STEPS}", Path(root) / f"{name}-consolidated.pt"
        )
    if any(move.startswith(f"{JSON}:") for move in options.move):
        # A third party's format (the example plugin's), holding DDP's weights, step and
        # scheduler at SAVE_AT: every strategy reads it through its registered format.
        plugin = importlib.import_module("plait_example_strategy")
        saved = torch.load(Path(root) / f"ddp-step{SAVE_AT}", weights_only=True)
        target = Path(root) / f"{JSON}-step{SAVE_AT}"
        entries = {"step": saved["step"], "scheduler": saved["scheduler"]}
        plugin.write_json(saved["state_dict"], entries, target)
    for move in options.move:
        source, target, *weights = move.split(":")
        mode = "weights" if weights else "moved"
        [result] = launch(target, root, (mode,), source)
        (Path(root) / f"{target}-{mode}-from-{source}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
