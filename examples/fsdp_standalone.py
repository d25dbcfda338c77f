"""Train a model sharded with FSDP on CPU processes, in a loop of your own (no Trainer).

    python examples/fsdp_standalone.py --processes 2 --epochs 5 --checkpoint out/fsdp

Each rank builds its FSDPStrategy, which shards every block of the model across the
ranks (a block's parameters are gathered only while it runs), builds the model on
the meta device so that no rank ever holds it whole, trains on its shard of the
data, and saves a sharded checkpoint (a directory, each rank writing its part). The
launching process then consolidates it into one file plain PyTorch loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from typing_extensions import override

from plait.core import seed_everything
from plait.strategies import FSDPStrategy
from plait.strategies.fsdp import consolidate_checkpoint
from plait.strategies.launchers import MultiprocessingLauncher


def regression_data(samples: int = 512, features: int = 8) -> TensorDataset:
    """Targets that a small network can learn, with a little noise."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, features, generator=generator)
    weights = torch.randn(features, 1, generator=generator)
    targets = inputs @ weights + 0.05 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


class Block(nn.Module):
    """A residual block: the unit FSDP shards and gathers."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


def train(epochs: int, checkpoint: Path) -> float:
    """One rank's training; returns the last epoch's loss, averaged over every rank."""
    seed_everything(0)
    strategy = FSDPStrategy(accelerator="cpu", auto_wrap_policy={Block})
    strategy.setup_environment()
    dataset = regression_data()
    layout = strategy.layout
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        dataset, num_replicas=layout.data_parallel_size, rank=layout.data_parallel_rank, seed=0
    )
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    with strategy.model_sharded_context():  # on the meta device: no memory yet
        layers = nn.Sequential(nn.Linear(8, 32), Block(32), Block(32), nn.Linear(32, 1))
    model, [optimizer] = strategy.setup_module_and_optimizers(
        layers, [torch.optim.Adam(layers.parameters(), lr=0.01)]
    )
    epoch_loss = float("nan")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for inputs, targets in loader:
            prediction = strategy.training_step(model, inputs)
            assert isinstance(prediction, torch.Tensor)
            loss = nn.functional.mse_loss(prediction, targets)
            strategy.backward(loss, model)
            strategy.optimizer_step(optimizer)
            strategy.zero_grad(optimizer)
            total, batches = total + loss.item(), batches + 1
        epoch_loss = strategy.reduce(total / batches, reduce_op="mean")
        if strategy.is_global_zero:
            print(f"epoch {epoch}: loss {epoch_loss:.4f} (mean over {strategy.world_size} ranks)")
    # Every rank writes its shards of the model and the optimizer.
    state = strategy.get_state_dict(model, [optimizer])
    strategy.save_checkpoint({**state, "epochs": epochs}, checkpoint)
    strategy.teardown()
    return epoch_loss


def main() -> None:
    """Launch the ranks, report rank 0's final loss, and consolidate the checkpoint."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2, help="ranks to start")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/fsdp_standalone"))
    args = parser.parse_args()
    launcher = MultiprocessingLauncher(args.processes, start_method="spawn")
    final = launcher.launch(train, args.epochs, args.checkpoint)
    exported = args.checkpoint.with_suffix(".pt")
    consolidate_checkpoint(args.checkpoint, exported, weights_only=True)
    print(
        f"final loss {final:.4f}; sharded checkpoint at {args.checkpoint}, one file at {exported}"
    )


if __name__ == "__main__":
    main()
