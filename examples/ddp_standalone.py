"""Train a small model with DDP on CPU processes, in a loop of your own (no Trainer).

    python examples/ddp_standalone.py --processes 2 --epochs 5 --checkpoint out/ddp
    python examples/ddp_standalone.py --processes 2 --epochs 8 --checkpoint out/ddp --resume
    torchrun --nproc-per-node 2 examples/ddp_standalone.py --epochs 5 --checkpoint out/ddp

The loop is the one every strategy runs (`fsdp_standalone.py` and
`deepspeed_standalone.py` differ from it in the line that builds the strategy, and
in building the model sharded): the strategy shards the data
(`setup_dataloader`), accumulates gradients over two batches without synchronising
the first (`no_sync`), averages the epoch's loss across ranks (`reduce`), saves the
model, optimizer, loader and epoch after each epoch in one call
(`save_checkpoint`), restores them in one call on `--resume` (`load_checkpoint`),
and exports the trained model as one file plain PyTorch loads
(`export_checkpoint`).

`strategy.launcher` starts the ranks on this machine (``spawn``); under torchrun
(or SLURM) it starts nothing, and each process runs `train` in place.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from plait.core import seed_everything
from plait.strategies import DDPStrategy

ACCUMULATE = 2  # batches per optimizer step


def regression_data(samples: int = 512, features: int = 8) -> TensorDataset:
    """Targets that a small network can learn, with a little noise."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, features, generator=generator)
    weights = torch.randn(features, 1, generator=generator)
    targets = inputs @ weights + 0.05 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def train(strategy: DDPStrategy, epochs: int, checkpoint: Path, resume: bool) -> float:
    """One rank's training; returns the last epoch's loss, averaged over every rank."""
    seed_everything(0)
    strategy.setup_environment()
    loader = strategy.setup_dataloader(DataLoader(regression_data(), batch_size=16, shuffle=True))
    layers = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    model, [optimizer] = strategy.setup_module_and_optimizers(
        layers, [torch.optim.AdamW(layers.parameters(), lr=0.01)]
    )
    state: dict[str, object] = {
        "model": model,
        "optimizer": optimizer,
        "loader": loader,
        "epoch": 0,
    }
    if resume:
        strategy.load_checkpoint(checkpoint / "last", state)  # in place, every entry
    first = state["epoch"]
    assert isinstance(first, int)
    epoch_loss = float("nan")
    for epoch in range(first, epochs):
        total, batches = 0.0, 0
        for index, (inputs, targets) in enumerate(loader):
            stepping = (index + 1) % ACCUMULATE == 0
            with strategy.no_sync(model, enabled=not stepping):  # no all-reduce until the last
                prediction = strategy.training_step(model, inputs)
                assert isinstance(prediction, torch.Tensor)
                loss = nn.functional.mse_loss(prediction, targets)
                strategy.backward(loss / ACCUMULATE, model)
            if stepping:
                strategy.optimizer_step(optimizer)
                strategy.zero_grad(optimizer)
            total, batches = total + loss.item(), batches + 1
        epoch_loss = strategy.reduce(total / batches, reduce_op="mean")
        if strategy.is_global_zero:
            print(f"epoch {epoch}: loss {epoch_loss:.4f} (mean over {strategy.world_size} ranks)")
        state["epoch"] = epoch + 1
        strategy.save_checkpoint(state, checkpoint / "last")
    strategy.export_checkpoint(model, checkpoint / "model.pt")
    if strategy.is_global_zero:
        print(f"final loss {epoch_loss:.4f}; checkpoint {checkpoint / 'last'}, "
              f"model {checkpoint / 'model.pt'}")  # fmt: skip
    strategy.teardown()
    return epoch_loss


def main() -> None:
    """Start the ranks (or, under torchrun, be one) and train."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2, help="ranks to start")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/ddp_standalone"))
    parser.add_argument("--resume", action="store_true", help="go on from the last epoch saved")
    parser.add_argument(
        "--start-method", default="spawn", choices=["spawn", "fork", "forkserver"],
        help="how the ranks start on this machine (fork in a notebook)",
    )  # fmt: skip
    args = parser.parse_args()
    args.checkpoint.mkdir(parents=True, exist_ok=True)
    strategy = DDPStrategy(
        accelerator="cpu",
        parallel_devices=[torch.device("cpu")] * args.processes,
        start_method=args.start_method,
    )
    strategy.launcher.launch(train, strategy, args.epochs, args.checkpoint, args.resume)


if __name__ == "__main__":
    main()
