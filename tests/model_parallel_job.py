"""A transformer block trained with ModelParallelStrategy in a loop of the user's own.

    python model_parallel_job.py ROOT

The block (attention and an MLP, each behind a norm, with residuals) is split
torchtitan's way: tensor parallel on its linear layers, sequence parallel on its
norms, then FSDP over the data-parallel ranks. Every run takes the same 4 samples a
step, split over the data-parallel ranks (the ranks of one tensor-parallel group
read the same ones), so its losses do not depend on the mesh shape:

- ``plain``: the same model and steps in this process, with no strategy at all;
- ``2x2``: 3 steps on (dp=2, tp=2), a checkpoint through DCP, 3 steps more;
- ``4x1``, ``1x4``, ``1x1``: that checkpoint loaded on another shape (``1x1`` in
  one process), then the same 3 steps;
- ``2x2-bf16`` and ``plain-bf16``: the 6 steps in ``bf16-mixed`` on (dp=2, tp=2),
  and in one process under the same autocast;
- ``context``: a decoder block with context-parallel attention on (dp=2, cp=2),
  resumed in one process, and the attention checked against whole-sequence
  attention (``context_parallel_job.py``);
- ``pp-*``: a stack of layers split into pipeline stages, every schedule at pp=2,
  pp x dp with FSDP and pp x tp, a checkpoint resumed in another stage layout and in
  one process without a pipeline (``pipeline_job.py``).

It writes ``ROOT/results.json``: each run's losses by step (from rank 0, the loss
averaged over the data-parallel group with ``reduce(..., group="dp")``), the layout
every rank saw, and what each rank's batch was.
"""

from __future__ import annotations

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

# Run as a script: the repository root holds the ``tests`` package its sibling is in.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tests import context_parallel_job, pipeline_job
from torch import nn
from typing_extensions import override

from plait.strategies import ModelParallelStrategy
from plait.strategies.launchers import MultiprocessingLauncher

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()

DIM: Final = 16
HEADS: Final = 4  # split over up to 4 tensor-parallel ranks
OUT: Final = 4  # no rank's shard of the head is empty, on any shape
SEQUENCE: Final = 8
BATCH: Final = 4  # samples a step, split over the data-parallel ranks
STEPS: Final = 6
SAVE_AT: Final = 3


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.wo = nn.Linear(DIM, DIM, bias=False)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        # Heads split over the tensor-parallel ranks: each holds DIM / tp of them.
        q, k, v = (w(x).view(batch, length, -1, DIM // HEADS).transpose(1, 2) for w in (
            self.wq, self.wk, self.wv
        ))  # fmt: skip
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(batch, length, -1))
        return result


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, 4 * DIM)
        self.w2 = nn.Linear(4 * DIM, DIM)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.w2(nn.functional.gelu(self.w1(x)))
        return result


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(DIM, DIM)
        self.attention_norm = nn.LayerNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.LayerNorm(DIM)
        self.feed_forward = FeedForward()
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, OUT)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = h + self.attention(self.attention_norm(h))
        h = h + self.feed_forward(self.ffn_norm(h))
        out: torch.Tensor = self.head(self.norm(h))
        return out


def parallelize(model: Model, strategy: ModelParallelStrategy) -> None:
    """torchtitan's plan: TP on the linear layers, SP on the norms, then FSDP."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415
    from torch.distributed.tensor import Replicate, Shard  # noqa: PLC0415
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = strategy.device_mesh
    # The hidden states between the layers are sharded along the sequence.
    parallelize_module(model, mesh["tp"], {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })  # fmt: skip
    shard = mesh["dp_shard"]
    for block in (model.attention, model.feed_forward):
        fully_shard(block, mesh=shard)
    fully_shard(model, mesh=shard)


def refusals(strategy: ModelParallelStrategy) -> dict[str, str]:
    """What the strategy says to a module nothing parallelized, to one split by tensor
    parallelism alone (its gradients never averaged over the data-parallel ranks),
    and to a collective over a dimension it has not."""
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    tensor_only = FeedForward()
    parallelize_module(
        tensor_only, strategy.device_mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
    )
    attempts = {
        "plain": lambda: strategy.setup_module(FeedForward()),
        "tensor_only": lambda: strategy.setup_module(tensor_only),
        "group": lambda: strategy.reduce(torch.ones(1), group="pd"),
    }
    return {name: context_parallel_job.refusal(attempt) for name, attempt in attempts.items()}


def samples(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's 4 samples: the same whatever the mesh."""
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, SEQUENCE, DIM, generator=generator)
    return x, x[..., :OUT].cumsum(dim=-1).tanh()


def plain(*, bf16: bool = False) -> dict[str, float]:
    """The model and steps in one process, with no strategy (under bf16 autocast)."""
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = {}
    for step in range(STEPS):
        x, y = samples(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad()
        losses[str(step)] = float(loss.detach())
    return losses


def optimizer_fingerprint(optimizer: torch.optim.Optimizer) -> list[float]:
    """This rank's optimizer state as numbers: one per tensor (its shard)."""
    numbers = []
    for state in optimizer.state.values():
        for key in sorted(state):
            value = state[key]
            if isinstance(value, torch.Tensor):
                numbers.append(float(_local(value).double().abs().sum()))
    return numbers


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def run(root: str, shape: str, precision: str = "32-true") -> dict[str, object]:
    """One run on the mesh ``shape`` (``DPxTP``); the first saves, the others resume.

    In another ``precision``, the 6 steps alone: no checkpoint is saved or loaded.
    """
    data_parallel, tensor_parallel = (int(size) for size in shape.split("x"))
    strategy = ModelParallelStrategy(
        data_parallel_size=data_parallel,
        tensor_parallel_size=tensor_parallel,
        accelerator="cpu",
        precision=precision,
    )
    saves = shape == "2x2" and precision == "32-true"
    strategy.setup_environment()
    layout = strategy.layout
    refused = refusals(strategy) if saves else {}
    torch.manual_seed(0)  # every rank builds the same whole model, then keeps its part
    model = Model()
    parallelize(model, strategy)
    adamw = torch.optim.AdamW(model.parameters(), lr=0.01)
    wrapped, [optimizer] = strategy.setup_module_and_optimizers(model, [adamw])
    checkpoint = Path(root) / "checkpoint"
    first = 0
    alone: dict[str, object] = {}
    if not saves and precision == "32-true":
        # The module alone first: its shards restored in place, the optimizer left as
        # it was, the run's entries given back; then the whole state.
        before = optimizer_fingerprint(optimizer)
        alone["left"] = sorted(strategy.load_checkpoint(checkpoint, wrapped))
        alone["untouched"] = optimizer_fingerprint(optimizer) == before
        probe, _ = samples(STEPS)  # the same on every rank
        alone_output = strategy.validation_step(wrapped, probe)
        state = {"model": wrapped, "optimizer": optimizer, "step": 0}
        strategy.load_checkpoint(checkpoint, state)
        output = strategy.validation_step(wrapped, probe)
        assert isinstance(output, torch.Tensor)
        assert isinstance(alone_output, torch.Tensor)
        alone["module"] = torch.equal(_whole(output), _whole(alone_output))
        first = int(state["step"])  # type: ignore[call-overload]
    losses, seen = {}, {}
    per_rank = BATCH // layout.data_parallel_size
    for step in range(first, STEPS):
        x, y = samples(step)
        mine = slice(
            layout.data_parallel_rank * per_rank, (layout.data_parallel_rank + 1) * per_rank
        )
        x, y = x[mine], y[mine]
        seen[str(step)] = float(x.sum())
        out = strategy.training_step(wrapped, x)  # in the precision's autocast
        assert isinstance(out, torch.Tensor)
        loss = nn.functional.mse_loss(out.float(), y)
        strategy.backward(loss, wrapped)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        losses[str(step)] = float(strategy.reduce(loss.detach(), group="dp"))
        if saves and step + 1 == SAVE_AT:
            strategy.save_checkpoint(
                {"model": wrapped, "optimizer": optimizer, "step": step + 1}, checkpoint
            )
    # Each rank's global rank summed over its tensor-parallel group (ranks numbered
    # row-major over (dp, tp): 0+1 and 2+3 at 2x2).
    tp_sum = int(strategy.reduce(torch.tensor(strategy.global_rank), group="tp", reduce_op="sum"))
    # Every rank's place, and what its last batch summed to: rows in rank order.
    where = torch.tensor([
        layout.data_parallel_rank, layout.data_parallel_size,
        layout.tensor_parallel_rank, layout.tensor_parallel_size,
    ])  # fmt: skip
    layouts = strategy.all_gather(where)
    batches = strategy.all_gather(torch.tensor([seen[str(STEPS - 1)]], dtype=torch.float64))
    dimensions = list(strategy.device_mesh.mesh_dim_names or ())
    strategy.teardown()
    return {
        "losses": losses,
        "layouts": layouts.tolist(),
        "batches": batches.flatten().tolist(),
        "refused": refused,
        "tp_sum": tp_sum,
        "dimensions": dimensions,
        "alone": alone,
    }


def in_turn(
    root: str, runs: dict[str, tuple[Callable[..., dict[str, object]], tuple[object, ...]]]
) -> dict[str, object]:
    """Each of ``runs`` (a function and its arguments after ``root``), one after another."""
    return {name: function(root, *arguments) for name, (function, arguments) in runs.items()}


def main() -> None:
    root = sys.argv[1]
    # Imported once here: the forked ranks find them loaded.
    import torch.distributed.checkpoint  # noqa: PLC0415
    import torch.distributed.fsdp  # noqa: PLC0415
    import torch.distributed.tensor.parallel  # noqa: F401, PLC0415

    # One launch per world, each shape's runs in turn in it (a launch is mostly
    # start-up): the 2x2 runs and the context-parallel one, then the resumed shapes.
    launcher = MultiprocessingLauncher(4, start_method="fork")
    results: dict[str, object] = {}
    results |= launcher.launch(in_turn, root, {
        "2x2": (run, ("2x2",)),
        "2x2-bf16": (run, ("2x2", "bf16-mixed")),
        "context": (context_parallel_job.run, (2, 2)),
        "context-hsdp": (context_parallel_job.run, (2, 2, 2)),
        "pp-fsdp": (pipeline_job.fsdp, ()),
        "pp-tp": (pipeline_job.fsdp, (2,)),
        "pp-cp": (pipeline_job.decoder, ()),
        "pp-norm": (pipeline_job.norm, ()),
    })  # fmt: skip
    results |= launcher.launch(in_turn, root, {"4x1": (run, ("4x1",)), "1x4": (run, ("1x4",))})
    results |= MultiprocessingLauncher(2, start_method="fork").launch(in_turn, root, {
        "pp-schedules": (pipeline_job.schedules, ()),
        "pp-broken": (pipeline_job.broken, ()),
        "pp-resume": (pipeline_job.resume, ()),
        "pp-ddp": (pipeline_job.ddp, ()),
    })  # fmt: skip
    # After the forks: a process that computed with several threads first hands its
    # children an OpenMP pool that hangs them, and one that joined a process group
    # hands them that group.
    results["1x1"] = run(root, "1x1")
    results["plain"] = plain()
    results["plain-bf16"] = plain(bf16=True)
    results["context-1x1"] = context_parallel_job.run(root, 1, 1)
    results["context-plain"] = context_parallel_job.plain()
    results["pp-1x1"] = pipeline_job.whole(root)
    results["pp-tp-1x1"] = pipeline_job.whole(root, "pp-tp-checkpoint")
    results["pp-plain"] = pipeline_job.plain()
    results["pp-plain-clipped"] = pipeline_job.plain(clip=True)
    results["pp-cp-plain"] = pipeline_job.decoder_plain()
    (Path(root) / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
