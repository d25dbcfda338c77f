"""Context-parallel attention on 2 gloo ranks: plait's against the same exchange by hand.

    python tools/bench_context.py --steps N --rounds R --out FILE [--length L]

Each rank holds half of every sequence (the load-balanced chunks r and 3 - r of 4).
A step is causal attention's forward and backward over the two ranks:

- ``plait``: ``ModelParallelStrategy(context_parallel_size=2)`` and
  ``context_parallel_attention(q, k, v, group=..., positions=..., is_causal=True)``;
- ``hand``: the exchange written by hand on torch's public API: keys and values
  all-gathered as DTensors (``Shard`` to ``Replicate``, the gradient placed
  ``Partial`` so that its backward sums the ranks' parts), and the mask made once
  from the positions every rank knows.

Both are checked to give the same outputs and gradients first. The sides take turns
within each round (the first round warms up and is dropped); rank 0 writes the
seconds per step of each side, a list over rounds, to ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

# Run as a script: the repository root holds the ``tools`` package its helper is in.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import two_ranks

BATCH, HEADS, HEAD_DIM = 4, 8, 32


def _rank(rank: int, port: int, args: argparse.Namespace) -> None:
    two_ranks.join_as(rank, port)
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard  # noqa: PLC0415

    from plait.strategies import ModelParallelStrategy  # noqa: PLC0415
    from plait.strategies.context_parallel import (  # noqa: PLC0415
        context_parallel_attention,
        sequence_positions,
    )

    torch.set_num_threads(1)  # two ranks on a machine of few cores: one thread each
    strategy = ModelParallelStrategy(
        data_parallel_size=1,
        tensor_parallel_size=1,
        context_parallel_size=2,
        accelerator="cpu",
        timeout=timedelta(minutes=2),
    )
    strategy.setup_environment()
    group = strategy.context_parallel_group
    assert group is not None
    length = args.length
    positions = strategy.sequence_positions(length)
    generator = torch.Generator().manual_seed(rank)
    q, k, v, grad = (
        torch.randn(BATCH, HEADS, length // 2, HEAD_DIM, generator=generator) for _ in range(4)
    )

    # By hand: a 1-D mesh over the same group, the mask from the layout both ranks know.
    mesh = DeviceMesh.from_group(group, "cpu", mesh_dim_names=("cp",))
    everywhere = torch.cat([sequence_positions(length, rank=r, size=2) for r in range(2)])
    mask = positions[:, None] >= everywhere[None, :]

    def gathered(tensor: torch.Tensor) -> torch.Tensor:
        whole = DTensor.from_local(tensor, mesh, [Shard(2)], run_check=False)
        return whole.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])

    def hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            q, gathered(k), gathered(v), attn_mask=mask
        )

    def plait(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return context_parallel_attention(q, k, v, group=group, positions=positions, is_causal=True)

    sides: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "plait": plait,
        "hand": hand,
    }

    def step(side: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = side(*leaves)
        out.backward(grad)  # type: ignore[no-untyped-call]
        return [out.detach(), *(leaf.grad for leaf in leaves if leaf.grad is not None)]

    for mine, theirs in zip(step(plait), step(hand), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)

    steps = {name: functools.partial(step, side) for name, side in sides.items()}
    results = two_ranks.time_sides(
        steps, rounds=args.rounds, steps=args.steps, barrier=lambda: dist.barrier(group=group)
    )
    two_ranks.write(rank, args.out, results)
    strategy.teardown()


def main() -> None:
    """Start the two ranks; fail if either does."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--length", type=int, default=512, help="tokens of a whole sequence")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.length % 4:
        parser.error(f"--length={args.length} must split into 4 chunks (2 ranks, load-balanced)")
    two_ranks.start(_rank, args, "context-parallel")


if __name__ == "__main__":
    main()
