"""Train with DeepSpeed's ZeRO on CPU processes, in a loop of your own (no Trainer).

    python examples/deepspeed_standalone.py --processes 2 --epochs 5 --stage 3 \
        --checkpoint out/deepspeed

Each rank builds its DeepSpeedStrategy (ZeRO stage 3 by default: parameters,
gradients and optimizer state partitioned across the ranks), builds the model
partitioned from the start, accumulates gradients over two batches before each
optimizer step, clips their global norm, and has the engine save its partitions (a
directory, each rank writing its part). The launching process then exports the
weights as one fp32 file that plain PyTorch loads, without DeepSpeed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from plait.core import seed_everything
from plait.strategies import DeepSpeedStrategy
from plait.strategies.deepspeed import consolidate_checkpoint
from plait.strategies.launchers import MultiprocessingLauncher

ACCUMULATE = 2


def regression_data(samples: int = 512, features: int = 8) -> TensorDataset:
    """Targets that a small network can learn, with a little noise."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, features, generator=generator)
    weights = torch.randn(features, 1, generator=generator)
    targets = inputs @ weights + 0.05 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def train(epochs: int, stage: int, checkpoint: Path) -> float:
    """One rank's training; returns the last epoch's loss, averaged over every rank."""
    seed_everything(0)
    strategy = DeepSpeedStrategy(accelerator="cpu", stage=stage)
    strategy.setup_environment()
    dataset = regression_data()
    layout = strategy.layout
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        dataset, num_replicas=layout.data_parallel_size, rank=layout.data_parallel_rank, seed=0
    )
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    with strategy.model_sharded_context():  # at stage 3, each rank keeps only its share
        layers = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    model, [optimizer] = strategy.setup_module_and_optimizers(
        layers, [torch.optim.AdamW(layers.parameters(), lr=0.02)]
    )
    epoch_loss = float("nan")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for index, (inputs, targets) in enumerate(loader):
            prediction = strategy.training_step(model, inputs)
            assert isinstance(prediction, torch.Tensor)
            loss = nn.functional.mse_loss(prediction, targets)
            # Gradients accumulate in the engine until the optimizer step.
            strategy.backward(loss / ACCUMULATE, model)
            if (index + 1) % ACCUMULATE == 0:
                strategy.clip_gradients(model, optimizer, clip_val=1.0)
                strategy.optimizer_step(optimizer)
            total, batches = total + loss.item(), batches + 1
        epoch_loss = strategy.reduce(total / batches, reduce_op="mean")
        if strategy.is_global_zero:
            print(f"epoch {epoch}: loss {epoch_loss:.4f} (mean over {strategy.world_size} ranks)")
    # Every rank has the engine write its partitions; the rest goes in beside them.
    strategy.save_checkpoint({"epochs": epochs}, checkpoint)
    strategy.teardown()
    return epoch_loss


def main() -> None:
    """Launch the ranks, report rank 0's final loss, and export the weights."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2, help="ranks to start")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--stage", type=int, default=3, choices=[0, 1, 2, 3])
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/deepspeed_standalone"))
    args = parser.parse_args()
    launcher = MultiprocessingLauncher(args.processes, start_method="spawn")
    final = launcher.launch(train, args.epochs, args.stage, args.checkpoint)
    exported = args.checkpoint.with_suffix(".pt")
    consolidate_checkpoint(args.checkpoint, exported)
    print(f"final loss {final:.4f}; DeepSpeed checkpoint at {args.checkpoint}, fp32 at {exported}")


if __name__ == "__main__":
    main()
