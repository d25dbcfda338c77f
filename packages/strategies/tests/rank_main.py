"""One rank of the multi-process strategy tests.

Usage: RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... python rank_main.py SCENARIOS

SCENARIOS is one scenario's name, or several separated by commas.

Each scenario checks its own results and raises on any difference; the test that
started the ranks checks that every rank exited 0 and reads what they printed.
"""

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState,
    post_localSGD_hook,
)
from typing_extensions import override

from plait.checkpoint_io import AsyncCheckpointIO, DistributedCheckpointIO, TorchCheckpointIO
from plait.core import CollectiveMismatchError, CollectiveTimeoutError, ConfigurationError
from plait.core.typing import PathLike
from plait.strategies import DDPShardedStrategy, DDPStrategy

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()


def expect(error: type[BaseException], action: Callable[[], object]) -> BaseException:
    try:
        action()
    except error as caught:
        return caught
    raise AssertionError(f"expected {error.__name__}")


def collectives(strategy: DDPStrategy) -> None:
    rank, world = strategy.global_rank, strategy.world_size
    ranks = torch.arange(world)

    ints = torch.tensor([rank + 1, 2 * rank])
    before = ints.clone()
    all_ints = torch.stack([torch.tensor([r + 1, 2 * r]) for r in range(world)])
    assert torch.equal(strategy.reduce(ints, reduce_op="sum"), all_ints.sum(0))
    assert torch.equal(strategy.reduce(ints, reduce_op="max"), all_ints.max(0).values)
    assert torch.equal(strategy.reduce(ints, reduce_op="min"), all_ints.min(0).values)
    assert torch.equal(strategy.reduce(ints, reduce_op="product"), all_ints.prod(0))
    mean = strategy.reduce(ints, reduce_op="mean")
    assert mean.dtype == torch.float32, mean.dtype  # never truncated
    assert torch.allclose(mean, all_ints.float().mean(0))
    assert torch.equal(ints, before)  # out of place

    flags = torch.tensor([rank == 0, True])
    assert torch.equal(strategy.reduce(flags, reduce_op="sum"), torch.tensor([1, world]))
    assert torch.equal(strategy.reduce(flags, reduce_op="min"), torch.tensor([world == 1, True]))
    assert strategy.reduce(flags, reduce_op="mean").dtype == torch.float32

    assert strategy.reduce(rank + 1, reduce_op="sum") == sum(range(1, world + 1))
    assert isinstance(strategy.reduce(rank, reduce_op="max"), int)
    assert strategy.reduce(rank, reduce_op="mean") == ranks.float().mean().item()
    assert isinstance(strategy.reduce(rank, reduce_op="avg"), float)
    assert strategy.reduce(0.5 * rank, reduce_op="sum") == 0.5 * sum(range(world))

    src = world - 1
    sent = torch.arange(6.0).reshape(2, 3) * (rank + 1)
    received = strategy.broadcast(sent if rank == src else None, src=src)
    assert isinstance(received, torch.Tensor)
    assert torch.equal(received, torch.arange(6.0).reshape(2, 3) * world)
    config = strategy.broadcast({"lr": 0.1, "rank": rank}, src=0)
    assert config == {"lr": 0.1, "rank": 0}, config

    gathered = strategy.all_gather(torch.full((2,), float(rank)))
    assert torch.equal(gathered, ranks.float().unsqueeze(1).expand(world, 2))
    # Checked, small tensors travel in the meeting that checks the call; these are
    # too large for it at any world size above 1, and take the collective.
    large = torch.full((10_000,), rank + 1, dtype=torch.int32)
    assert torch.equal(
        strategy.reduce(large, reduce_op="sum"), torch.full_like(large, world * (world + 1) // 2)
    )
    assert torch.equal(strategy.reduce(large, reduce_op="max"), torch.full_like(large, world))
    assert strategy.reduce(large, reduce_op="mean").dtype == torch.float32
    rows = strategy.all_gather(large)
    assert torch.equal(rows[:, 0], ranks.int() + 1)
    assert strategy.reduce_boolean_decision(rank == 0, all=False) is True
    assert strategy.reduce_boolean_decision(rank == 0, all=True) is (world == 1)
    strategy.barrier("end")

    # Found by the conformance suite: element i is element i whatever each rank's
    # strides; int16, which gloo cannot move, still works; Python floats keep digits.
    laid_out = torch.arange(4.0).reshape(2, 2)
    mine = laid_out.t().contiguous().t() if rank % 2 else laid_out
    assert torch.equal(strategy.reduce(mine, reduce_op="sum"), laid_out * world)
    shorts = torch.tensor([rank, -rank], dtype=torch.int16)
    short_sum = strategy.reduce(shorts, reduce_op="sum")
    assert short_sum.dtype == torch.int16
    assert short_sum.tolist() == [sum(range(world)), -sum(range(world))]
    assert strategy.all_gather(shorts).dtype == torch.int16
    assert strategy.broadcast(shorts, src=0).tolist() == [0, 0]
    assert strategy.reduce(16777217.0 if rank == 0 else 0.0, reduce_op="sum") == 16777217.0
    assert strategy.reduce(16777217 if rank == 0 else 0, reduce_op="mean") == 16777217 / world

    expect(ValueError, lambda: strategy.broadcast(1, src=world))
    expect(TypeError, lambda: strategy.reduce("3", reduce_op="sum"))  # type: ignore[call-overload]
    expect(ConfigurationError, lambda: strategy.reduce(ints, reduce_op="median"))
    strategy.barrier("after errors")  # the bad calls left the ranks in step
    print(f"rank {rank}: collectives ok")


def broadcasts(strategy: DDPStrategy) -> None:
    # Checked, small values travel in the meeting and larger ones in one broadcast;
    # unchecked, a header broadcast goes first. Either way every rank ends equal.
    rank, src = strategy.global_rank, strategy.world_size - 1
    sent: list[torch.Tensor] = [
        torch.arange(16.0),  # inline
        torch.arange(100_000, dtype=torch.float64).reshape(1000, 100),  # a broadcast
        torch.arange(5_000, dtype=torch.int16),  # gloo cannot move int16: widened
        torch.tensor([True, False, True]),
        torch.tensor(7),  # 0-dim
        torch.empty(0, 3),
        torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
    ]
    for expected in sent:
        mine = expected * 0 if rank != src else expected
        received = strategy.broadcast(mine, src=src)
        assert received.dtype == expected.dtype
        assert received.shape == expected.shape
        assert torch.equal(received, expected), (received, expected)
        if rank == src and expected.numel():  # src's result is a copy, not its tensor
            assert received.data_ptr() != expected.data_ptr()
    small = {"lr": 0.1, "betas": (0.9, 0.999), "rank": rank}
    assert strategy.broadcast(small, src=src) == {**small, "rank": src}
    large = {"rows": list(range(20_000)), "rank": rank}  # pickles to more than 8 KiB
    assert strategy.broadcast(large, src=src) == {**large, "rank": src}
    assert strategy.broadcast(None if rank else "from 0", src=0) == "from 0"
    unpicklable = (lambda: rank) if rank == src else None
    if strategy.world_size == 1:  # nothing moves, as on a single device
        assert strategy.broadcast(unpicklable, src=src) is unpicklable
    elif strategy.checked_collectives:  # unchecked, only the rank that cannot send fails
        error = expect(TypeError, lambda: strategy.broadcast(unpicklable, src=src))
        assert f"src={src}'s object cannot be pickled" in str(error), error
    strategy.barrier("after broadcasts")
    print(f"rank {rank}: broadcasts ok")


def mismatch(strategy: DDPStrategy) -> None:
    rank = strategy.global_rank
    error = expect(
        CollectiveMismatchError,
        lambda: strategy.reduce(torch.ones(2), reduce_op="sum" if rank == 0 else "max"),
    )
    assert isinstance(error, CollectiveMismatchError)
    print(f"rank {rank}: disagreeing {list(error.disagreeing_ranks)}")
    shape = (2,) if rank == 0 else (3,)
    error = expect(CollectiveMismatchError, lambda: strategy.all_gather(torch.ones(shape)))
    if rank == 0:
        expect(CollectiveMismatchError, lambda: strategy.barrier("sync"))
    else:
        expect(CollectiveMismatchError, lambda: strategy.reduce(1.0, reduce_op="sum"))
    # Mismatches are found before any data moves, so the ranks are still in step.
    assert strategy.reduce(1, reduce_op="sum") == strategy.world_size
    print(f"rank {rank}: mismatch ok")


def report_timeout(rank: int, action: Callable[[], object]) -> None:
    """Expect ``action`` to time out; print the ranks it missed, its text and notes."""
    error = expect(CollectiveTimeoutError, action)
    assert isinstance(error, CollectiveTimeoutError)
    notes = "\n".join(getattr(error, "__notes__", []))
    print(f"rank {rank}: missing {list(error.missing_ranks)}: {error}\n{notes}")


def barrier_timeout(strategy: DDPStrategy) -> None:
    rank, last = strategy.global_rank, strategy.world_size - 1
    store = strategy.distributed_collectives.store
    if rank == last:
        store.wait(["released"], timedelta(seconds=60))  # absent from the barrier
        return
    report_timeout(rank, lambda: strategy.barrier("epoch", timeout=2.0))
    store.set("released", "1")


def waiting_elsewhere(strategy: DDPStrategy) -> None:
    """Ranks 0 and 1 wait in a barrier; rank 2 in another, over ranks 1 and 2."""
    import torch.distributed as dist  # noqa: PLC0415

    rank = strategy.global_rank
    store = strategy.distributed_collectives.store
    pair = dist.new_group([1, 2], backend="gloo")
    if rank == 2:
        report_timeout(rank, lambda: strategy.barrier("pair", timeout=6.0, group=pair))
        store.set("pair timed out", "1")
    else:
        report_timeout(rank, lambda: strategy.barrier("all", timeout=4.0))
        # Rank 1 stays until rank 2's barrier has timed out: its leaving would end
        # that barrier first, as a peer that closed its connection.
        store.wait(["pair timed out"], timedelta(seconds=60))


def train(
    strategy: DDPStrategy | None, steps: int = 5, optimizer_class: type = torch.optim.SGD
) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    inputs = torch.randn(12, 4, generator=torch.Generator().manual_seed(1))
    targets = torch.randn(12, 1, generator=torch.Generator().manual_seed(2))
    if strategy is not None:
        world, rank = strategy.world_size, strategy.global_rank
        inputs, targets = inputs.chunk(world)[rank], targets.chunk(world)[rank]
        model = strategy.setup_module(model)
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    if strategy is not None:
        [optimizer] = strategy.setup_optimizers([optimizer])
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        if strategy is None:
            torch.autograd.backward(loss)
            optimizer.step()
        else:
            strategy.backward(loss, model)
            strategy.optimizer_step(optimizer)
    return [parameter.detach().clone() for parameter in model.parameters()]


def ddp_equivalence(strategy: DDPStrategy) -> None:
    distributed = train(strategy)
    single = train(None)
    worst = max((d - s).abs().max().item() for d, s in zip(distributed, single, strict=True))
    assert worst < 1e-6, worst
    print(f"rank {strategy.global_rank}: ddp matches one process (max diff {worst:.1e})")


def fp16_hook(strategy: DDPStrategy) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    reference = nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    wrapped = strategy.setup_module(model)
    inputs = torch.randn(4, 3, generator=torch.Generator().manual_seed(10 + strategy.global_rank))
    strategy.backward(wrapped(inputs).pow(3).sum() * 1e-3, wrapped)
    reference(inputs).pow(3).sum().mul(1e-3).backward()
    assert reference.weight.grad is not None
    assert model.weight.grad is not None
    local = strategy.all_gather(reference.weight.grad)
    world = strategy.world_size
    expected = (local[0].half() / world + local[1].half() / world).float()
    exact = local.mean(0)
    assert torch.equal(model.weight.grad, expected), (model.weight.grad, expected)
    assert not torch.equal(model.weight.grad, exact)  # the compression really happened
    print(f"rank {strategy.global_rank}: fp16 compression applied")


def sharded_equivalence(strategy: DDPStrategy) -> None:
    assert isinstance(strategy, DDPShardedStrategy)
    sharded = train(strategy, optimizer_class=torch.optim.Adam)
    single = train(None, optimizer_class=torch.optim.Adam)
    worst = max((d - s).abs().max().item() for d, s in zip(sharded, single, strict=True))
    assert worst < 1e-6, worst
    model = strategy.setup_module(nn.Linear(4, 4))
    [optimizer] = strategy.setup_optimizers([torch.optim.Adam(model.parameters(), lr=0.1)])
    strategy.backward(model(torch.ones(2, 4)).sum(), model)
    strategy.optimizer_step(optimizer)
    local = optimizer.optim.state  # type: ignore[attr-defined]
    full = strategy.optimizer_state_dict(optimizer)
    if strategy.is_global_zero:
        assert len(full["state"]) == 2, full  # weight and bias, gathered from every rank
    assert len(local) < 2  # each rank holds only its share
    print(f"rank {strategy.global_rank}: sharded matches one process, holds {len(local)} of 2")


def model_averaging(strategy: DDPStrategy) -> None:
    # Warm-up step 0 all-reduces gradients; afterwards each rank steps on its own
    # data, and every second step (1, 3, ...) the replicas are averaged.
    # A subgroup of one rank each: between averagings, the replicas really diverge.
    state = strategy.ddp_comm_state
    assert isinstance(state, PostLocalSGDState)
    state.subgroup, _ = torch.distributed.new_subgroups(group_size=1)  # type: ignore[no-untyped-call]
    torch.manual_seed(0)
    model = strategy.setup_module(nn.Linear(3, 1))
    [optimizer] = strategy.setup_optimizers([torch.optim.SGD(model.parameters(), lr=0.1)])
    inputs = torch.randn(4, 3, generator=torch.Generator().manual_seed(strategy.global_rank))
    same = []
    for _ in range(5):
        optimizer.zero_grad()
        strategy.backward(model(inputs).pow(2).mean(), model)
        strategy.optimizer_step(optimizer)
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        rows = strategy.all_gather(flat)
        same.append(bool(torch.allclose(rows[0], rows[1])))
    assert same == [True, True, False, True, False], same
    print(f"rank {strategy.global_rank}: replicas averaged every 2 steps {same}")


def groups(strategy: DDPStrategy) -> None:
    """Collectives over a sub-group (ranks 0 and 2 of 3) keep the contract among its ranks."""
    rank = strategy.global_rank
    pair = torch.distributed.new_group([0, 2], backend="gloo")
    # The whole job, by name: the data-parallel dimension of plain DDP.
    assert strategy.reduce(1, group="data_parallel", reduce_op="sum") == 3
    error = expect(ConfigurationError, lambda: strategy.reduce(1, "sum"))
    assert "pass reduce_op='sum'" in str(error), error
    error = expect(ConfigurationError, lambda: strategy.reduce(1, group="tensor"))
    assert "'data_parallel'" in str(error), error
    if rank == 1:
        error = expect(ValueError, lambda: strategy.reduce(1, group=pair))
        assert "not in" in str(error), error
    else:
        assert strategy.reduce(rank + 1, group=pair, reduce_op="sum") == 4
        ints = torch.tensor([rank, 1])
        mean = strategy.reduce(ints, group=pair)
        assert torch.equal(mean, torch.tensor([1.0, 1.0])), mean
        assert ints.tolist() == [rank, 1]  # out of place
        large = torch.full((10_000,), float(rank))
        assert torch.equal(strategy.reduce(large, pair, "max"), torch.full((10_000,), 2.0))
        rows = strategy.all_gather(torch.tensor([rank, rank * 10]), group=pair)
        assert rows.tolist() == [[0, 0], [2, 20]], rows
        assert strategy.broadcast(f"from {rank}", src=2, group=pair) == "from 2"
        tensor = strategy.broadcast(torch.arange(3) * rank, src=2, group=pair)
        assert tensor.tolist() == [0, 2, 4], tensor
        error = expect(ValueError, lambda: strategy.broadcast(1, src=1, group=pair))
        assert "the group's ranks [0, 2]" in str(error), error
        strategy.barrier("pair", group=pair)
        if rank == 0:  # the ranks of the group disagree: both raise, neither hangs
            expect(CollectiveMismatchError, lambda: strategy.barrier("first", group=pair))
        else:
            expect(CollectiveMismatchError, lambda: strategy.barrier("second", group=pair))
    # The whole job is still in step after the group's collectives.
    assert strategy.reduce(rank, reduce_op="sum") == 3
    strategy.barrier("after groups")
    print(f"rank {rank}: groups ok")


class SlowTorchCheckpointIO(TorchCheckpointIO):
    """torch's files, each save started a second late: the others reach their load first."""

    @override
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        time.sleep(1.0)  # widens the window a load could fall in; no rank waits on it
        super().save_checkpoint(checkpoint, path)


def background_save_then_load(strategy: DDPStrategy) -> None:
    # Rank 0 alone writes, in a background thread; every rank loads at once after
    # the save: load_checkpoint must see the whole checkpoint on every rank.
    rank = strategy.global_rank
    made = tempfile.mkdtemp(prefix="plait-async-") if rank == 0 else ""
    directory = Path(strategy.broadcast(made, src=0))
    model = strategy.setup_module(nn.Linear(3, 2))
    for step in range(3):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(float(step))
        path = directory / f"step={step}.ckpt"
        strategy.save_checkpoint({"model": model, "step": step}, path)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(-1.0)
        rest = strategy.load_checkpoint(path, {"model": model, "step": -1})
        assert all(bool((p == float(step)).all()) for p in model.parameters()), step
        assert dict(rest) == {}, rest
    strategy.barrier("background saves read")
    if rank == 0:
        shutil.rmtree(directory)  # read by every rank: the folder is this job's to remove
    print(f"rank {rank}: background saves ok")


def batch_norm_saved(strategy: DDPStrategy) -> None:
    # Each rank's batch norm counts its own batch; every rank writes its part of the
    # checkpoint (DCP), which holds one value of each buffer: rank 0's, loaded by all.
    rank = strategy.global_rank
    made = tempfile.mkdtemp(prefix="plait-norm-") if rank == 0 else ""
    directory = Path(strategy.broadcast(made, src=0))
    torch.manual_seed(0)
    model = strategy.setup_module(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)))
    model(torch.randn(5, 3) * (rank + 1))
    inner = strategy.unwrap_module(model)
    assert isinstance(inner, nn.Sequential)
    norm = inner[1]
    own = {name: buffer.clone() for name, buffer in norm.named_buffers()}
    zeros = strategy.broadcast(own, src=0)
    assert rank == 0 or not torch.equal(own["running_var"], zeros["running_var"])
    state = strategy.get_state_dict(model)["state_dict"]
    assert isinstance(state, dict)
    for name, value in zeros.items():
        assert torch.equal(state[f"1.{name}"], value), name
    # get_state_dict copied rank 0's: this rank's module keeps its own until it loads.
    assert all(torch.equal(b, own[n]) for n, b in norm.named_buffers())
    path = directory / "norm"
    strategy.save_checkpoint({"model": model}, path)
    strategy.load_checkpoint(path, {"model": model})
    for name, buffer in norm.named_buffers():
        assert torch.equal(buffer, zeros[name]), name
    strategy.barrier("batch norm read")
    if rank == 0:
        shutil.rmtree(directory)
    print(f"rank {rank}: rank 0's buffers saved and loaded")


SCENARIOS: dict[str, tuple[Callable[[DDPStrategy], None], dict[str, object]]] = {
    "collectives": (collectives, {}),
    "collectives_unchecked": (collectives, {"checked_collectives": False}),
    "broadcasts": (broadcasts, {}),
    "broadcasts_unchecked": (broadcasts, {"checked_collectives": False}),
    "groups": (groups, {}),
    "groups_unchecked": (groups, {"checked_collectives": False}),
    "mismatch": (mismatch, {}),
    "background_save_then_load": (
        background_save_then_load,
        {"checkpoint_io": AsyncCheckpointIO(SlowTorchCheckpointIO())},
    ),
    "batch_norm_saved": (batch_norm_saved, {"checkpoint_io": DistributedCheckpointIO()}),
    "barrier_timeout": (barrier_timeout, {}),
    "waiting_elsewhere": (waiting_elsewhere, {}),
    "ddp_equivalence": (ddp_equivalence, {}),
    "fp16_hook": (fp16_hook, {"ddp_comm_hook": default_hooks.fp16_compress_hook}),
    # The same compression, as a wrapper around the plain all-reduce hook.
    "fp16_wrapper": (
        fp16_hook,
        {
            "ddp_comm_hook": default_hooks.allreduce_hook,
            "ddp_comm_wrapper": default_hooks.fp16_compress_wrapper,
        },
    ),
    "static_graph": (ddp_equivalence, {"static_graph": True}),
    "sharded_equivalence": (sharded_equivalence, {}),
    "model_averaging": (
        model_averaging,
        {
            # torch's PostLocalSGDState is unannotated.
            "ddp_comm_state": PostLocalSGDState(None, None, start_localSGD_iter=1),  # type: ignore[no-untyped-call]
            "ddp_comm_hook": post_localSGD_hook,
            "model_averaging_period": 2,
        },
    ),
}


def run(name: str) -> None:
    """Run the scenario ``name`` on a strategy of its own, set up and torn down."""
    scenario, options = SCENARIOS[name]
    kind = DDPShardedStrategy if name.startswith("sharded") else DDPStrategy
    strategy = kind(accelerator="cpu", timeout=timedelta(seconds=60), **options)  # type: ignore[arg-type]
    strategy.setup_environment()
    path = strategy.distributed_collectives.path
    print(f"rank {strategy.global_rank}: agreeing through the {path}")
    try:
        scenario(strategy)
    finally:
        strategy.teardown()


if __name__ == "__main__":
    # One scenario, or several separated by commas: one job runs them in turn, each
    # on a strategy (and process group) of its own, each under a header line.
    for name in sys.argv[1].split(","):
        print(f"== scenario {name}", flush=True)
        run(name)
