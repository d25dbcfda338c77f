"""Context parallelism on ModelParallelStrategy, in a loop of the user's own.

Run by ``model_parallel_job.py`` (one launch of 4 ranks on (dp=2, cp=2), then one
process):

- ``attention``: on every rank, `context_parallel_attention` over its cp group
  against ``scaled_dot_product_attention`` over the whole sequence, outputs and the
  gradients of the rank's queries, keys and values, for contiguous and load-balanced
  slices, causal or not; and the broken control, a plain causal mask over the
  load-balanced slice, which must be far off;
- ``cp``: a decoder block whose attention is context-parallel, FSDP over
  ``dp_shard_cp``, 3 steps, a checkpoint, 3 steps more; its losses against the same
  model in one process with no strategy (``cp-plain``), and the checkpoint resumed
  in one process (``cp-1x1``);
- what the strategy says to a module sharded over ``dp_shard`` alone with cp = 2,
  and to causal attention over the cp group with no positions.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

import torch
from torch import nn
from typing_extensions import override

from plait.strategies import ModelParallelStrategy
from plait.strategies.context_parallel import context_parallel_attention, sequence_positions

DIM: Final = 8
HEADS: Final = 2
SEQUENCE: Final = 8  # 4 chunks of 2 over cp = 2, load-balanced
BATCH: Final = 4
STEPS: Final = 6
SAVE_AT: Final = 3


class Attention(nn.Module):
    """Causal self-attention: the sequence may be split over the cp ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.group: torch.distributed.ProcessGroup | None = None

    @override
    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (w(x).view(batch, length, HEADS, -1).transpose(1, 2) for w in (
            self.wq, self.wk, self.wv
        ))  # fmt: skip
        out = context_parallel_attention(
            q, k, v, group=self.group, positions=positions, is_causal=True
        )
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(batch, length, DIM))
        return result


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.attention = Attention()
        self.feed_forward = nn.Sequential(
            nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM)
        )
        self.head = nn.Linear(DIM, 2)

    @override
    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = h + self.attention(self.norm(h), positions)
        h = h + self.feed_forward(h)
        out: torch.Tensor = self.head(h)
        return out


def samples(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's samples, the same on every shape: the target depends on earlier tokens."""
    generator = torch.Generator().manual_seed(2000 + step)
    x = torch.randn(BATCH, SEQUENCE, DIM, generator=generator)
    return x, x[..., :2].cumsum(dim=1).tanh()


def plain() -> dict[str, float]:
    """The decoder in one process, with no strategy."""
    torch.manual_seed(0)
    model = Decoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = {}
    for step in range(STEPS):
        x, y = samples(step)
        loss = nn.functional.mse_loss(model(x, torch.arange(SEQUENCE)), y)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad()
        losses[str(step)] = float(loss.detach())
    return losses


def attention_errors(group: torch.distributed.ProcessGroup, rank: int) -> dict[str, float]:
    """The largest difference from whole-sequence attention, by check."""
    generator = torch.Generator().manual_seed(7)  # the same whole tensors on every rank
    q, k, v, grad = (
        torch.randn(2, HEADS, SEQUENCE, 4, generator=generator, dtype=torch.float64)
        for _ in range(4)
    )
    errors: dict[str, float] = {}
    for causal in (True, False):
        whole = [t.clone().requires_grad_() for t in (q, k, v)]
        expected = nn.functional.scaled_dot_product_attention(
            whole[0], whole[1], whole[2], is_causal=causal
        )
        expected.backward(grad)  # type: ignore[no-untyped-call]
        for balanced in (False, True):
            positions = sequence_positions(SEQUENCE, rank=rank, size=2, load_balanced=balanced)
            mine = [t[:, :, positions].clone().requires_grad_() for t in (q, k, v)]
            out = context_parallel_attention(
                mine[0], mine[1], mine[2], group=group, positions=positions, is_causal=causal
            )
            out.backward(grad[:, :, positions])  # type: ignore[no-untyped-call]
            name = f"{'causal' if causal else 'full'}-{'balanced' if balanced else 'contiguous'}"
            differences = [(out - expected[:, :, positions]).abs().max()] + [
                (part.grad - w.grad[:, :, positions]).abs().max()  # type: ignore[index, operator]
                for part, w in zip(mine, whole, strict=True)
            ]
            errors[name] = float(max(differences))
    # The broken control: each rank's causal mask over its own load-balanced slice.
    positions = sequence_positions(SEQUENCE, rank=rank, size=2, load_balanced=True)
    expected = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    local = nn.functional.scaled_dot_product_attention(
        q[:, :, positions], k[:, :, positions], v[:, :, positions], is_causal=True
    )
    errors["plain-mask-balanced"] = float((local - expected[:, :, positions]).abs().max())
    return errors


def refusals(strategy: ModelParallelStrategy) -> dict[str, str]:
    """What the strategy says to FSDP over dp_shard alone with cp = 2, and to causal
    attention over the cp group with no positions."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    shard_only = Decoder()
    fully_shard(shard_only, mesh=strategy.device_mesh["dp_shard"])
    q = torch.zeros(1, 1, 4, 2)
    attempts: dict[str, Callable[[], object]] = {
        "dp_shard_only": lambda: strategy.setup_module(shard_only),
        "no_positions": lambda: context_parallel_attention(
            q, q, q, group=strategy.context_parallel_group, is_causal=True
        ),
        "uneven": lambda: strategy.shard_sequence(torch.zeros(1, 6)),
    }
    return {name: refusal(attempt) for name, attempt in attempts.items()}


def refusal(attempt: Callable[[], object]) -> str:
    """What ``attempt`` raised (a ConfigurationError's text), or ``"not refused"``."""
    from plait.core import ConfigurationError  # noqa: PLC0415

    try:
        attempt()
    except ConfigurationError as error:
        return str(error)
    return "not refused"


def run(
    root: str, data_parallel: int, context_parallel: int, replicas: int = 1
) -> dict[str, object]:
    """Train the decoder on (dp, cp); on (2, 2) save after step 3, on (1, 1) resume there.

    With ``replicas``, hybrid sharding: the 6 steps alone, FSDP over the 2-D
    (``dp_replicate``, ``dp_shard_cp``) mesh.
    """
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    strategy = ModelParallelStrategy(
        data_parallel_size=data_parallel,
        tensor_parallel_size=1,
        context_parallel_size=context_parallel,
        data_parallel_replicate_size=replicas,
        accelerator="cpu",
    )
    strategy.setup_environment()
    saves = context_parallel > 1 and replicas == 1
    result: dict[str, object] = {}
    if saves:
        group = strategy.context_parallel_group
        assert group is not None
        result["attention"] = attention_errors(group, strategy.layout.rank_in("cp"))
        result["refused"] = refusals(strategy)
    torch.manual_seed(0)  # every rank builds the same whole model, then keeps its shards
    model = Decoder()
    model.attention.group = strategy.context_parallel_group
    mesh = strategy.data_parallel_mesh
    for block in (model.attention, model.feed_forward):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    adamw = torch.optim.AdamW(model.parameters(), lr=0.01)
    wrapped, [optimizer] = strategy.setup_module_and_optimizers(model, [adamw])
    checkpoint = Path(root) / "cp-checkpoint"
    first = 0
    if context_parallel == 1:
        state = {"model": wrapped, "optimizer": optimizer, "step": 0}
        strategy.load_checkpoint(checkpoint, state)
        first = int(state["step"])  # type: ignore[call-overload]
    layout = strategy.layout
    per_rank = BATCH // layout.data_parallel_size
    positions = strategy.sequence_positions(SEQUENCE)
    losses = {}
    for step in range(first, STEPS):
        x, y = samples(step)
        rows = slice(
            layout.data_parallel_rank * per_rank, (layout.data_parallel_rank + 1) * per_rank
        )
        x, y = strategy.shard_sequence(x[rows]), strategy.shard_sequence(y[rows])
        out = strategy.training_step(wrapped, x, positions)
        assert isinstance(out, torch.Tensor)
        loss = nn.functional.mse_loss(out, y)
        strategy.backward(loss, wrapped)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        # Every token of the step: averaged over the data- and context-parallel ranks.
        losses[str(step)] = float(strategy.reduce(loss.detach(), group="dp_cp"))
        if saves and step + 1 == SAVE_AT:
            strategy.save_checkpoint(
                {"model": wrapped, "optimizer": optimizer, "step": step + 1}, checkpoint
            )
    result["losses"] = losses
    result["fsdp_mesh"] = list(mesh.mesh_dim_names or ())
    # Each rank's place and its tokens: rows in rank order.
    where = torch.tensor([layout.data_parallel_rank, layout.rank_in("cp"), *positions.tolist()])
    result["places"] = strategy.all_gather(where).tolist()
    result["dimensions"] = list(strategy.device_mesh.mesh_dim_names or ())
    strategy.teardown()
    return result
