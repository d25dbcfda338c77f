"""Train a small model with DDP on CPU processes, in a loop of your own (no Trainer).

    python examples/ddp_standalone.py --processes 2 --epochs 5 --checkpoint out/last.pt

Each rank builds its DDPStrategy (which finds its place from the variables the
launcher set), trains on its shard of a synthetic regression set, and averages
the epoch loss across ranks. Rank 0 saves the checkpoint and returns the final
loss to the launching process.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from plait.core import seed_everything
from plait.strategies import DDPStrategy
from plait.strategies.launchers import MultiprocessingLauncher


def regression_data(samples: int = 512, features: int = 8) -> TensorDataset:
    """Targets that a linear model can learn, with a little noise."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, features, generator=generator)
    weights = torch.randn(features, 1, generator=generator)
    targets = inputs @ weights + 0.05 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def train(epochs: int, checkpoint: Path) -> float:
    """One rank's training; returns the last epoch's loss, averaged over every rank."""
    seed_everything(0)
    strategy = DDPStrategy(accelerator="cpu")
    strategy.setup_environment()
    dataset = regression_data()
    layout = strategy.layout  # data is sharded by the data-parallel rank and size
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        dataset, num_replicas=layout.data_parallel_size, rank=layout.data_parallel_rank, seed=0
    )
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    layer = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    model, [optimizer] = strategy.setup_module_and_optimizers(
        layer, [torch.optim.Adam(layer.parameters(), lr=0.01)]
    )
    epoch_loss = float("nan")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for inputs, targets in loader:
            prediction = strategy.training_step(model, inputs)  # through DDP's wrapper
            assert isinstance(prediction, torch.Tensor)
            loss = nn.functional.mse_loss(prediction, targets)
            strategy.backward(loss, model)
            strategy.optimizer_step(optimizer)
            strategy.zero_grad(optimizer)
            total, batches = total + loss.item(), batches + 1
        epoch_loss = strategy.reduce(total / batches, reduce_op="mean")
        if strategy.is_global_zero:
            print(f"epoch {epoch}: loss {epoch_loss:.4f} (mean over {strategy.world_size} ranks)")
    strategy.save_checkpoint(
        {"model": strategy.module_state_dict(model), "epochs": epochs}, checkpoint
    )
    strategy.barrier("checkpoint saved")
    strategy.teardown()
    return epoch_loss


def main() -> None:
    """Launch the ranks and report rank 0's final loss."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2, help="ranks to start")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/ddp_standalone.pt"))
    args = parser.parse_args()
    launcher = MultiprocessingLauncher(args.processes, start_method="spawn")
    final = launcher.launch(train, args.epochs, args.checkpoint)
    print(f"final loss {final:.4f}; checkpoint at {args.checkpoint}")


if __name__ == "__main__":
    main()
