"""Ranks that share one GPU over gloo: the gloo-cuda conformance lane's strategies, and a job.

The factories (``ddp``, ``fsdp``, ``deepspeed``) put every rank of the job on
``cuda:0`` and join a gloo process group, which moves CUDA tensors through host
memory: several ranks on a machine of one GPU. NCCL would refuse two ranks on one GPU.

As a script, a DDP job of 5 SGD steps on batches of 8, each rank taking its share:

    python shared_gpu.py BACKEND OUT    # nccl (one rank), or gloo (ranks on cuda:0)

Rank 0 writes OUT (JSON): the trained weights, the device and the backend.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from plait.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy


def _one_gpu() -> list[torch.device]:
    return [torch.device("cuda", 0)] * int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def ddp() -> DDPStrategy:
    """DDP with every rank on ``cuda:0``, over gloo."""
    return DDPStrategy(parallel_devices=_one_gpu(), process_group_backend="gloo")


def fsdp() -> FSDPStrategy:
    """FSDP with every rank on ``cuda:0``, over gloo."""
    return FSDPStrategy(parallel_devices=_one_gpu(), process_group_backend="gloo")


def deepspeed() -> DeepSpeedStrategy:
    """DeepSpeed (ZeRO-2) with every rank on ``cuda:0``, over gloo."""
    return DeepSpeedStrategy(parallel_devices=_one_gpu(), process_group_backend="gloo")


def main(backend: str, out: Path) -> None:
    """Train, each rank on its share of every batch; rank 0 writes ``out``."""
    world_size = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(world_size))
    strategy = DDPStrategy(parallel_devices=_one_gpu(), process_group_backend=backend)
    strategy.setup_environment()
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model, [optimizer] = strategy.setup_module_and_optimizers(
        layers, [torch.optim.SGD(layers.parameters(), lr=0.1)]
    )
    device = strategy.root_device
    generator = torch.Generator().manual_seed(1)
    share = slice(rank * 8 // world_size, (rank + 1) * 8 // world_size)
    for _ in range(5):
        x = torch.randn(8, 8, generator=generator)
        y = x.sum(dim=1, keepdim=True)
        output = strategy.training_step(model, x[share].to(device))
        assert isinstance(output, torch.Tensor)
        strategy.backward(torch.nn.functional.mse_loss(output, y[share].to(device)), model)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
    weights = strategy.module_state_dict(model)
    if rank == 0:
        result = {
            "weights": {key: value.cpu().tolist() for key, value in weights.items()},
            "devices": sorted({str(value.device) for value in weights.values()}),
            "backend": str(dist.get_backend()),
        }
        out.write_text(json.dumps(result))
    strategy.teardown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
