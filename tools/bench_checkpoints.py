"""Checkpoint speed: plait's checkpoint IO against the same call on raw DCP.

Two workloads, each run as its own program by ``tools/bench --sections checkpoints``:

  sharded  two gloo ranks hold a state of MEGABYTES in all, as DTensors sharded over
           both (each rank half): seconds to save it and to load it back in place,
           through `DistributedCheckpointIO` and through `torch.distributed.checkpoint`'s
           own save and load, the two sides alternating round by round
  async    one process: the cost of an `AsyncCheckpointIO` save of MEGABYTES to the
           training steps that run while it writes (the steps' time beside the save,
           less the same steps' time alone), against the time of a synchronous save
           of the same state

Each writes its figures, by side, to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

# Run as a script: the repository root holds the ``tools`` package its helper is in.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import two_ranks

_FLOAT_BYTES = 4
_COLUMNS = 1024


def _sharded_state(megabytes: int, rank: int, world_size: int) -> dict[str, object]:
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.tensor import DTensor, Shard  # noqa: PLC0415

    mesh = init_device_mesh("cpu", (world_size,))
    tensors = 16
    rows = max(world_size, megabytes * 2**20 // (_FLOAT_BYTES * _COLUMNS * tensors))
    rows -= rows % world_size
    generator = torch.Generator().manual_seed(rank)
    model = {
        f"layer{index}.weight": DTensor.from_local(
            torch.randn(rows // world_size, _COLUMNS, generator=generator), mesh, [Shard(0)]
        )
        for index in range(tensors)
    }
    return {"state_dict": model, "step": 7}


def _timed(action: Callable[[], object]) -> float:
    dist.barrier()
    started = time.perf_counter()
    action()
    dist.barrier()
    return time.perf_counter() - started


def _sharded_rank(rank: int, world_size: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)  # two ranks on a machine of few cores: one thread each
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(minutes=5))
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # noqa: PLC0415

    from plait.checkpoint_io import DistributedCheckpointIO  # noqa: PLC0415

    state = _sharded_state(args.megabytes, rank, world_size)
    io = DistributedCheckpointIO()
    root = Path(args.dir)
    sides: dict[str, tuple[Callable[[Path], object], Callable[[Path], object]]] = {
        "raw": (
            lambda path: dcp_save(state, checkpoint_id=path),
            lambda path: dcp_load(state, checkpoint_id=path),
        ),
        "plait": (
            lambda path: io.save_checkpoint(state, path),
            lambda path: io.load_checkpoint_into(path, state),
        ),
    }
    figures: dict[str, list[float]] = {
        f"{kind}_{side}": [] for kind in ("save", "load") for side in sides
    }
    names = list(sides)
    for index in range(args.rounds + 1):  # the first round warms up and is dropped
        shift = index % len(names)
        for side in [*names[shift:], *names[:shift]]:
            save, load = sides[side]
            path = root / f"{side}-{index}"
            saving = _timed(lambda: save(path))  # noqa: B023 - called at once
            loading = _timed(lambda: load(path))  # noqa: B023 - called at once
            if index:
                figures[f"save_{side}"].append(saving)
                figures[f"load_{side}"].append(loading)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path)
    if rank == 0:
        Path(args.out).write_text(json.dumps(figures), encoding="utf-8")
    dist.destroy_process_group()


def sharded(args: argparse.Namespace) -> None:
    """Save and load of a sharded state on two gloo ranks, plait against raw DCP."""
    from plait.core import free_port  # noqa: PLC0415

    context = two_ranks.process_context()
    port = free_port()
    ranks = [context.Process(target=_sharded_rank, args=(rank, 2, port, args)) for rank in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    codes = [process.exitcode for process in ranks]
    if any(codes):
        raise RuntimeError(f"the checkpoint ranks exited with {codes}")


def _steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, count: int) -> float:
    batch = torch.randn(64, model[0].in_features)  # type: ignore[index]
    started = time.perf_counter()
    for _ in range(count):
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def _async_cost(
    state: dict[str, torch.Tensor],
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    synchronous: float,
    keep_buffers: bool,
) -> float:
    """The time an asynchronous save adds to the steps that run while it writes."""
    from plait.checkpoint_io import AsyncCheckpointIO  # noqa: PLC0415

    per_step = _steps(model, optimizer, 20) / 20
    # Steps enough to outlast the save, so that all of its writing overlaps them.
    steps = max(10, math.ceil(1.5 * synchronous / per_step))
    io = AsyncCheckpointIO(keep_buffers=keep_buffers)
    if keep_buffers:  # a run's first save fills the buffers; the next ones copy into them
        io.save_checkpoint(state, path)
        io.wait()
    alone = _steps(model, optimizer, steps)
    started = time.perf_counter()
    io.save_checkpoint(state, path)
    _steps(model, optimizer, steps)
    beside = time.perf_counter() - started
    io.teardown()
    path.unlink()
    return beside - alone


def asynchronous(args: argparse.Namespace) -> None:
    """The cost of an asynchronous save to the steps it overlaps, against a synchronous save.

    Two sides: the default `AsyncCheckpointIO` beside steps that use every core; and
    one that keeps its buffers between saves, beside steps on one thread, which leave
    a core to the writer as steps on a GPU leave the CPU's.
    """
    from plait.checkpoint_io import TorchCheckpointIO  # noqa: PLC0415

    root = Path(args.dir)
    count = max(1, args.megabytes * 2**20 // (_FLOAT_BYTES * _COLUMNS * 16))
    state = {f"w{index}": torch.randn(count, _COLUMNS) for index in range(16)}
    width = 256
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(),
                                torch.nn.Linear(width, width))  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    threads = torch.get_num_threads()
    figures: dict[str, list[float]] = {"synchronous": [], "cost": [], "cost_kept_one_thread": []}
    for index in range(args.rounds + 1):  # the first round warms up and is dropped
        path = root / f"save-{index}.pt"
        started = time.perf_counter()
        TorchCheckpointIO().save_checkpoint(state, path)
        synchronous = time.perf_counter() - started
        path.unlink()
        torch.set_num_threads(threads)
        cost = _async_cost(state, path, model, optimizer, synchronous=synchronous,
                           keep_buffers=False)  # fmt: skip
        torch.set_num_threads(1)
        kept = _async_cost(state, path, model, optimizer, synchronous=synchronous,
                           keep_buffers=True)  # fmt: skip
        torch.set_num_threads(threads)
        if index:
            figures["synchronous"].append(synchronous)
            figures["cost"].append(cost)
            figures["cost_kept_one_thread"].append(kept)
    Path(args.out).write_text(json.dumps(figures), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Run one workload and write its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=("sharded", "async"))
    parser.add_argument("--megabytes", type=int, default=1024, help="the state's size in all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", required=True, help="where checkpoints are written")
    parser.add_argument("--out", required=True, help="the JSON to write")
    args = parser.parse_args(argv)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    if args.workload == "sharded":
        sharded(args)
    else:
        asynchronous(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
