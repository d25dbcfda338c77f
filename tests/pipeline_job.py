"""Pipeline parallelism on ModelParallelStrategy, in a loop of the user's own.

Run by ``model_parallel_job.py``:

- ``pp-schedules`` (2 ranks, pp = 2): every torch schedule trains the same stack of
  layers for 3 steps; losses on every rank against one process (``pp-plain``), the
  forward-only evaluation after them, and what a V-shaped schedule says when asked
  to evaluate; clipping by the norm over both stages against one process's;
- ``pp-broken`` (2 ranks): a stage that skips its backward (its input detached),
  whose losses must leave one process's;
- ``pp-fsdp`` (4 ranks, pp = 2 x dp = 2, FSDP on each stage): 1F1B for 3 steps, a
  checkpoint, 3 steps more; ``pp-tp`` (pp = 2 x tp = 2) the same with the layers
  split over tp; ``pp-resume`` (2 ranks, Interleaved1F1B: 4 stages where 2 were
  saved) and ``pp-1x1`` (one process, the whole model, no pipeline) resume the
  checkpoint and must give the uninterrupted run's losses;
- ``pp-cp`` (4 ranks, pp = 2 x cp = 2): a decoder of two blocks with
  context-parallel attention, the tokens' positions passed to every stage, against
  the same decoder in one process (``pp-cp-plain``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import torch
from tests import context_parallel_job
from torch import nn
from typing_extensions import override

from plait.strategies import ModelParallelStrategy
from plait.strategies.pipeline import SCHEDULES, Pipeline

WIDTH: Final = 8
DEPTH: Final = 6
BATCH: Final = 8
STEPS: Final = 6
SAVE_AT: Final = 3
UNITS: Final = ("embed", *(f"layers.{i}" for i in range(DEPTH)), "norm", "head")
CLIP: Final = 0.05


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.tanh(self.up(x)))
        return out


class Stack(nn.Module):
    """Layers in a ModuleDict, each part skipped when a pipeline stage does not hold it."""

    def __init__(self, *, detach_input: bool = False) -> None:
        super().__init__()
        self.embed: nn.Module | None = nn.Linear(4, WIDTH)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(DEPTH)})
        self.norm: nn.Module | None = nn.LayerNorm(WIDTH)
        self.head: nn.Module | None = nn.Linear(WIDTH, 1)
        self.detach_input = detach_input

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        if self.detach_input and self.embed is None:
            h = h.detach()  # the broken control: the stages before it get no gradient
        for layer in self.layers.values():
            if layer is not None:
                h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.head(h) if self.head is not None else h


def samples(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3000 + step)
    x = torch.randn(BATCH, 4, generator=generator)
    return x, (x[:, :1] * x[:, 1:2]).tanh()


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def plain(*, clip: bool = False) -> dict[str, float]:
    """The stack in one process, with no strategy; ``clip``: clipped at `CLIP`."""
    torch.manual_seed(0)
    model = Stack()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses: dict[str, float] = {}
    for step in range(STEPS):
        x, y = samples(step)
        loss = loss_fn(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        if clip:
            losses[f"norm-{step}"] = float(nn.utils.clip_grad_norm_(model.parameters(), CLIP))
        optimizer.step()
        optimizer.zero_grad()
        losses[str(step)] = float(loss.detach())
        if step + 1 == SAVE_AT:
            with torch.no_grad():
                x, y = samples(STEPS)
                losses["eval"] = float(loss_fn(model(x), y))
    return losses


def _strategy(**sizes: int | str) -> ModelParallelStrategy:
    strategy = ModelParallelStrategy(accelerator="cpu", **sizes)  # type: ignore[arg-type]
    strategy.setup_environment()
    return strategy


def _rows(strategy: ModelParallelStrategy, tensor: torch.Tensor) -> torch.Tensor:
    layout = strategy.layout
    per_rank = BATCH // layout.data_parallel_size
    return tensor[layout.data_parallel_rank * per_rank : (layout.data_parallel_rank + 1) * per_rank]


def _train(
    strategy: ModelParallelStrategy,
    pipeline: Pipeline,
    steps: range,
    *,
    clip: bool = False,
    save: Path | None = None,
    load: Path | None = None,
) -> dict[str, float]:
    module = strategy.setup_module(pipeline)
    assert module is pipeline
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(pipeline.parameters(), lr=0.01)])
    if load is not None:
        state = {"model": pipeline, "optimizer": optimizer, "step": 0}
        strategy.load_checkpoint(load, state)
        assert state["step"] == steps.start, state["step"]
    losses: dict[str, float] = {}
    for step in steps:
        x, y = samples(step)
        loss = pipeline.step(_rows(strategy, x), target=_rows(strategy, y))
        if clip:
            before = _norm(strategy, optimizer)
            strategy.clip_gradients(pipeline, optimizer, CLIP)
            losses[f"norm-{step}"] = before
            losses[f"clipped-{step}"] = _norm(strategy, optimizer)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        # The loss reaches every rank; averaged over the data-parallel ones.
        losses[str(step)] = float(strategy.reduce(loss, group="dp"))
        if save is not None and step + 1 == SAVE_AT:
            strategy.save_checkpoint(
                {"model": pipeline, "optimizer": optimizer, "step": step + 1}, save
            )
    return losses


def _norm(strategy: ModelParallelStrategy, optimizer: torch.optim.Optimizer) -> float:
    # The norm over every stage's gradients, as one process would compute it.
    squared = torch.zeros(())
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if parameter.grad is not None:
                grad = parameter.grad
                full = getattr(grad, "full_tensor", None)
                squared += (full() if callable(full) else grad).square().sum()
    return float(strategy.reduce(squared, group="pp", reduce_op="sum").sqrt())


def schedules(root: str) -> dict[str, object]:
    """Every schedule at pp = 2, clipping at pp = 2, and the V-shaped refusal to evaluate."""
    strategy = _strategy(pipeline_parallel_size=2, data_parallel_size=1, tensor_parallel_size=1)
    result: dict[str, object] = {}
    for name in SCHEDULES:
        torch.manual_seed(0)
        pipeline = strategy.pipeline(Stack(), loss_fn, units=UNITS, schedule=name)
        losses = _train(strategy, pipeline, range(SAVE_AT))
        x, y = samples(STEPS)
        try:
            losses["eval"] = float(pipeline.evaluate(x, target=y))
        except Exception as error:  # noqa: BLE001 - the refusal's text is the result
            result[f"eval-refused-{name}"] = f"{type(error).__name__}: {error}"
        losses["stages"] = float(len(pipeline.stages))
        result[name] = losses
    torch.manual_seed(0)
    pipeline = strategy.pipeline(Stack(), loss_fn, units=UNITS)
    result["clipped"] = _train(strategy, pipeline, range(SAVE_AT), clip=True)
    result["losses_everywhere"] = strategy.all_gather(
        torch.tensor([result["1F1B"]["0"]])  # type: ignore[index]
    ).tolist()
    strategy.teardown()
    return result


def broken(root: str) -> dict[str, object]:
    """A stage that skips its backward: the stages before it never learn."""
    strategy = _strategy(pipeline_parallel_size=2, data_parallel_size=1, tensor_parallel_size=1)
    torch.manual_seed(0)
    pipeline = strategy.pipeline(Stack(detach_input=True), loss_fn, units=UNITS)
    losses = _train(strategy, pipeline, range(SAVE_AT))
    strategy.teardown()
    return {"losses": losses}


def fsdp(root: str, tensor: int = 1) -> dict[str, object]:
    """pp = 2 with FSDP over dp = 2 (or tp = 2 and dp = 1), 6 steps, saved after 3."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    strategy = _strategy(
        pipeline_parallel_size=2,
        data_parallel_size=2 // tensor,
        tensor_parallel_size=tensor,
    )
    torch.manual_seed(0)
    pipeline = strategy.pipeline(Stack(), loss_fn, units=UNITS)
    mesh = strategy.device_mesh
    for part in pipeline.parts:
        assert isinstance(part, Stack)
        if tensor > 1:
            from torch.distributed.tensor.parallel import (  # noqa: PLC0415
                ColwiseParallel,
                RowwiseParallel,
                parallelize_module,
            )

            for block in part.layers.values():
                if block is not None:
                    parallelize_module(
                        block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()}
                    )
        for block in part.layers.values():
            if block is not None:
                fully_shard(block, mesh=strategy.data_parallel_mesh, reshard_after_forward=False)
        fully_shard(part, mesh=strategy.data_parallel_mesh, reshard_after_forward=False)
    checkpoint = Path(root) / ("pp-tp-checkpoint" if tensor > 1 else "pp-checkpoint")
    losses = _train(strategy, pipeline, range(STEPS), save=checkpoint)
    dimensions = list(strategy.device_mesh.mesh_dim_names or ())
    layout = strategy.layout
    places = strategy.all_gather(
        torch.tensor([layout.data_parallel_rank, layout.rank_in("pp"), *pipeline.stages])
    ).tolist()
    strategy.teardown()
    return {"losses": losses, "dimensions": dimensions, "places": places}


class NormStack(Stack):
    """The stack with batch normalization before its head: running statistics per rank."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(WIDTH)


def norm(root: str) -> dict[str, object]:
    """pp = 2 x dp = 2 with batch norm: a sharded checkpoint of buffers the ranks differ on.

    Each rank's running statistics come from its own rows; the checkpoint, saved after
    3 steps, holds the first data-parallel rank's of each stage, which every rank of
    the stage loads back.
    """
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    def made() -> tuple[ModelParallelStrategy, Pipeline]:
        strategy = _strategy(pipeline_parallel_size=2, data_parallel_size=2)
        torch.manual_seed(0)
        pipeline = strategy.pipeline(NormStack(), loss_fn, units=UNITS)
        for part in pipeline.parts:
            fully_shard(part, mesh=strategy.data_parallel_mesh)
        return strategy, pipeline

    def statistics(pipeline: Pipeline) -> list[float]:
        return [
            float(value)
            for name, buffer in pipeline.named_buffers()
            if name.endswith("running_mean")
            for value in buffer.reshape(-1)
        ]

    path = Path(root) / "pp-norm-checkpoint"
    strategy, pipeline = made()
    losses = _train(strategy, pipeline, range(SAVE_AT), save=path)
    before = statistics(pipeline)
    # The forwards each rank's batch norm counted (none on the first stage).
    tracked = sum(
        int(buffer) for name, buffer in pipeline.named_buffers() if name.endswith("batches_tracked")
    )
    runs = len(losses) * pipeline.microbatches
    strategy.teardown()
    strategy, pipeline = made()
    _train(strategy, pipeline, range(SAVE_AT, SAVE_AT), load=path)
    after = statistics(pipeline)
    import torch.distributed as dist  # noqa: PLC0415

    seen: list[tuple[list[float], list[float], int] | None] = [None] * strategy.world_size
    dist.all_gather_object(seen, (before, after, tracked))
    strategy.teardown()
    held = [one for one in seen if one is not None]
    return {
        "losses": losses,
        "before": [one[0] for one in held],
        "after": [one[1] for one in held],
        "tracked": [one[2] for one in held],
        "microbatch_forwards": runs,
    }


def resume(root: str) -> dict[str, object]:
    """The pp = 2 x dp = 2 checkpoint into 4 stages on pp = 2 (Interleaved1F1B)."""
    strategy = _strategy(pipeline_parallel_size=2, data_parallel_size=1, tensor_parallel_size=1)
    torch.manual_seed(1)  # other weights: the checkpoint must replace them all
    pipeline = strategy.pipeline(Stack(), loss_fn, units=UNITS, schedule="Interleaved1F1B")
    losses = _train(strategy, pipeline, range(SAVE_AT, STEPS), load=Path(root) / "pp-checkpoint")
    strategy.teardown()
    return {"losses": losses, "stages": list(pipeline.stages)}


def ddp(root: str) -> dict[str, object]:
    """The pp = 2 x dp = 2 checkpoint into plain DDP on 2 ranks: model and optimizer."""
    from plait.strategies import DDPStrategy  # noqa: PLC0415

    strategy = DDPStrategy(accelerator="cpu")
    strategy.setup_environment()
    torch.manual_seed(1)
    model = Stack()
    wrapped, [optimizer] = strategy.setup_module_and_optimizers(
        model, [torch.optim.AdamW(model.parameters(), lr=0.01)]
    )
    state = {"model": wrapped, "optimizer": optimizer, "step": 0}
    strategy.load_checkpoint(Path(root) / "pp-checkpoint", state)
    losses: dict[str, float] = {}
    for step in range(int(state["step"]), STEPS):  # type: ignore[call-overload]
        x, y = samples(step)
        loss = loss_fn(strategy.training_step(wrapped, _rows(strategy, x)), _rows(strategy, y))  # type: ignore[arg-type]
        strategy.backward(loss, wrapped)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        losses[str(step)] = float(strategy.reduce(loss.detach()))
    strategy.teardown()
    return {"losses": losses}


def whole(root: str, checkpoint: str = "pp-checkpoint") -> dict[str, object]:
    """A pipeline's checkpoint into the whole model, in one process, with no pipeline."""
    strategy = _strategy(data_parallel_size=1, tensor_parallel_size=1)
    torch.manual_seed(1)
    model = Stack()
    wrapped, [optimizer] = strategy.setup_module_and_optimizers(
        model, [torch.optim.AdamW(model.parameters(), lr=0.01)]
    )
    state = {"model": wrapped, "optimizer": optimizer, "step": 0}
    strategy.load_checkpoint(Path(root) / checkpoint, state)
    loaded = {name: value.clone() for name, value in model.state_dict().items()}
    losses: dict[str, float] = {}
    for step in range(int(state["step"]), STEPS):  # type: ignore[call-overload]
        x, y = samples(step)
        loss = loss_fn(wrapped(x), y)
        strategy.backward(loss, wrapped)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        losses[str(step)] = float(loss.detach())
    strategy.teardown()
    # consolidate_checkpoint writes the whole model in one file: the tensors loaded.
    from plait.strategies import consolidate_checkpoint  # noqa: PLC0415

    whole_file = Path(root) / f"{checkpoint}.pt"
    consolidate_checkpoint(Path(root) / checkpoint, whole_file)
    consolidated = torch.load(whole_file, weights_only=True)["state_dict"]
    same = consolidated.keys() == loaded.keys() and all(
        torch.equal(consolidated[name], value) for name, value in loaded.items()
    )
    return {"losses": losses, "consolidated_whole": same}


class DecoderBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(context_parallel_job.DIM)
        self.attention = context_parallel_job.Attention()
        self.feed_forward = nn.Sequential(
            nn.Linear(context_parallel_job.DIM, 2 * context_parallel_job.DIM),
            nn.GELU(),
            nn.Linear(2 * context_parallel_job.DIM, context_parallel_job.DIM),
        )

    @override
    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.norm(x), positions)
        out: torch.Tensor = h + self.feed_forward(h)
        return out


class Decoder(nn.Module):
    """Two decoder blocks between an embedding and a head; positions per sample."""

    def __init__(self) -> None:
        super().__init__()
        dim = context_parallel_job.DIM
        self.embed: nn.Module | None = nn.Linear(dim, dim)
        self.layers = nn.ModuleDict({str(i): DecoderBlock() for i in range(2)})
        self.head: nn.Module | None = nn.Linear(dim, 2)

    @override
    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # ``positions`` is (batch, tokens), every row the same: a keyword a pipeline
        # splits into microbatches along dimension 0, as it does the inputs.
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            if layer is not None:
                h = layer(h, positions[0])
        return self.head(h) if self.head is not None else h


DECODER_UNITS: Final = ("embed", "layers.0", "layers.1", "head")


def decoder_plain() -> dict[str, float]:
    """The decoder in one process, with no strategy."""
    torch.manual_seed(0)
    model = Decoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = {}
    length = context_parallel_job.SEQUENCE
    for step in range(SAVE_AT):
        x, y = context_parallel_job.samples(step)
        positions = torch.arange(length).expand(x.shape[0], length)
        loss = loss_fn(model(x, positions), y)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad()
        losses[str(step)] = float(loss.detach())
    return losses


def decoder(root: str) -> dict[str, object]:
    """The decoder on pp = 2 x cp = 2: FSDP over dp_shard_cp on each stage."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    strategy = _strategy(
        pipeline_parallel_size=2,
        context_parallel_size=2,
        data_parallel_size=1,
        tensor_parallel_size=1,
    )
    torch.manual_seed(0)
    pipeline = strategy.pipeline(Decoder(), loss_fn, units=DECODER_UNITS)
    for part in pipeline.parts:
        assert isinstance(part, Decoder)
        for block in part.layers.values():
            if isinstance(block, DecoderBlock):
                block.attention.group = strategy.context_parallel_group
                fully_shard(block, mesh=strategy.data_parallel_mesh, reshard_after_forward=False)
        fully_shard(part, mesh=strategy.data_parallel_mesh, reshard_after_forward=False)
    strategy.setup_module(pipeline)
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(pipeline.parameters(), lr=0.01)])
    length = context_parallel_job.SEQUENCE
    positions = strategy.sequence_positions(length)
    losses: dict[str, float] = {}
    for step in range(SAVE_AT):
        x, y = context_parallel_job.samples(step)
        x, y = strategy.shard_sequence(x), strategy.shard_sequence(y)
        loss = pipeline.step(x, target=y, positions=positions.expand(x.shape[0], -1))
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        # Every token of the step: averaged over the context-parallel ranks.
        losses[str(step)] = float(strategy.reduce(loss, group="dp_cp"))
    dimensions = list(strategy.device_mesh.mesh_dim_names or ())
    strategy.teardown()
    return {"losses": losses, "dimensions": dimensions}
