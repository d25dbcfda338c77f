"""Training jobs with FSDPStrategy (or DDP, to compare), as a user writes them.

    python fsdp_job.py ROOT TAG --strategy fsdp --devices 2 --epochs 2 [options]

Every rank gets the same batches (a list, which the Trainer does not shard), so a
run's trajectory does not depend on the world size: runs at 1, 2 and 3 processes,
and runs resumed at another world size, can be compared step by step. Each rank
writes ``ROOT/TAG-rank<r>.json``: losses by step, the bytes of the state it holds,
how often each block ran forward, the dtype the blocks computed in, where the
parameters lived; the caller writes ``ROOT/TAG-final.json`` with the trained weights.
"""

from __future__ import annotations

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import argparse
import itertools
import json
import os
import resource
from collections.abc import Iterable
from pathlib import Path

import torch
from typing_extensions import override

from plait.core import StrategyRegistry, seed_everything
from plait.strategies import DDPStrategy, FSDPStrategy
from plait.strategies.fsdp import SizeBasedPolicy, consolidate_checkpoint
from plait.trainer import Callback, ModelCheckpoint, Module, Trainer

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()

WIDTH = int(os.environ.get("FSDP_JOB_WIDTH", "16"))


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.forwards = 0
        self.dtypes: set[str] = set()

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        self.dtypes.add(str(self.linear.weight.dtype))
        out: torch.Tensor = torch.relu(self.linear(x)) + x
        return out


class Net(Module):
    def __init__(self, *, depth: int, lazy: bool, sgd: bool = False) -> None:
        super().__init__()
        self.depth = depth
        self.sgd = sgd
        self.peak_before_build = 0
        self.blocks: torch.nn.Sequential | None = None
        self.head: torch.nn.Linear | None = None
        if not lazy:
            self.configure_model()
        self.losses: dict[int, float] = {}

    @override
    def configure_model(self) -> None:
        if self.blocks is None:
            # What sharding imports and allocates once is not the model's: paid first.
            import torch.distributed.checkpoint.state_dict  # noqa: PLC0415
            import torch.distributed.fsdp  # noqa: PLC0415

            torch.nn.Linear(WIDTH, WIDTH)(torch.randn(8, WIDTH)).sum().backward()
            self.peak_before_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.blocks = torch.nn.Sequential(*(Block() for _ in range(self.depth)))
            self.head = torch.nn.Linear(WIDTH, 1)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.blocks is not None
        assert self.head is not None
        out: torch.Tensor = self.head(self.blocks(x))
        return out

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, tuple)
        x, y = batch
        loss: torch.Tensor = torch.nn.functional.mse_loss(self(x).float(), y)
        self.losses[self.trainer.global_step] = float(loss.detach())
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        assert isinstance(batch, list | tuple)
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)
        self.log("val_seen", len(x), reduce_fx="sum", sync_dist=True)

    @override
    def configure_optimizers(self) -> object:
        if self.sgd:
            return torch.optim.SGD(self.parameters(), lr=0.01)
        return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.01)


def _blocks(module: Net) -> list[Block]:
    assert module.blocks is not None
    return [block for block in module.blocks if isinstance(block, Block)]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    local = getattr(tensor, "to_local", None)
    result: torch.Tensor = local() if callable(local) else tensor
    return result


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors)


class Measure(Callback):
    """Records, on each rank, what that rank holds and how the blocks ran."""

    def __init__(self, root: Path, tag: str) -> None:
        self.root, self.tag = root, tag
        self.state_bytes: dict[str, int] = {}
        self.forwards_per_step: list[int] = []

    @override
    def on_before_optimizer_step(
        self, trainer: Trainer, module: Module, optimizer: torch.optim.Optimizer
    ) -> None:
        assert isinstance(module, Net)
        assert module.blocks is not None
        self.forwards_per_step.append(sum(b.forwards for b in _blocks(module)))
        if (
            optimizer.state or self.forwards_per_step[1:]
        ):  # the optimizer holds its state: the optimizer holds its state
            parameters = list(module.parameters())
            self.state_bytes = {
                "parameters": _bytes(parameters),
                "gradients": _bytes(p.grad for p in parameters if p.grad is not None),
                "optimizer": _bytes(
                    value
                    for state in optimizer.state.values()
                    for value in state.values()
                    if isinstance(value, torch.Tensor) and value.dim() > 0
                ),
                "full_parameters": sum(p.numel() * p.element_size() for p in parameters),
            }

    @override
    def on_fit_end(self, trainer: Trainer, module: Module) -> None:
        assert isinstance(module, Net)
        assert module.blocks is not None
        strategy = trainer.strategy
        counts = self.forwards_per_step
        result = {
            "losses": {str(step): loss for step, loss in module.losses.items()},
            "state_bytes": self.state_bytes,
            "forwards_per_step": [b - a for a, b in itertools.pairwise(counts)],
            "dtypes": sorted({d for b in _blocks(module) for d in b.dtypes}),
            "devices": sorted({_local(p).device.type for p in module.parameters()}),
            "val_seen": float(trainer.callback_metrics.get("val_seen", -1)),
            "checkpointed": len(getattr(strategy, "checkpointed", [])),
            "blocks": len(getattr(strategy, "blocks", [])),
            "offload": getattr(strategy, "cpu_offload", None) is not None,
            "peak_growth": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            - module.peak_before_build,
        }
        path = self.root / f"{self.tag}-rank{trainer.global_rank}.json"
        path.write_text(json.dumps(result))


def _batches(count: int, seed: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        x = torch.randn(size, WIDTH, generator=generator)
        batches.append((x, x.sum(dim=1, keepdim=True) / WIDTH))
    return batches


# The ranks are forked from this process, which has imported torch, plait and
# torch.distributed's FSDP and checkpointing once (each rank would import them again,
# seconds of CPU apiece, if started anew). The launchers themselves are tested in
# tests/reliability and by the command line's tests. On a GPU the default stands:
# a forked process cannot use the CUDA its parent may have started.


def _strategy(arguments: argparse.Namespace) -> object:
    # After fit, --then-validate goes on in every rank's program, as the default
    # launcher runs it: forked ranks would leave it to this process alone.
    forked = arguments.accelerator == "cpu" and not arguments.then_validate
    fork: dict[str, object] = {"start_method": "fork"} if forked else {}
    import torch.distributed.checkpoint  # noqa: PLC0415
    import torch.distributed.fsdp  # noqa: F401, PLC0415

    if arguments.strategy == "ddp":
        return DDPStrategy(**fork)  # type: ignore[arg-type]
    options: dict[str, object] = json.loads(arguments.options)
    if options.pop("checkpoint_blocks", False):
        options["activation_checkpointing"] = Block
    wrap = options.pop("wrap", None)
    if wrap == "blocks":
        options["auto_wrap_policy"] = {Block}
    elif isinstance(wrap, int):
        options["auto_wrap_policy"] = SizeBasedPolicy(wrap)
    if "device_mesh" in options:
        mesh = options["device_mesh"]
        assert isinstance(mesh, list)
        options["device_mesh"] = (int(mesh[0]), int(mesh[1]))
    if arguments.strategy == "fsdp":
        return FSDPStrategy(**fork, **options)  # type: ignore[arg-type]
    return StrategyRegistry.get(arguments.strategy, **fork, **options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("tag")
    parser.add_argument("--strategy", default="fsdp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--options", default="{}")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--lazy", action="store_true", help="build under model_sharded_context")
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--uneven-validation", action="store_true")
    parser.add_argument("--sgd", action="store_true")
    parser.add_argument("--batches", type=int, default=4, help="training batches an epoch")
    parser.add_argument("--no-checkpoints", action="store_true")
    parser.add_argument(
        "--keep-every-epoch", action="store_true",
        help="keep every epoch's checkpoint, not only the newest",
    )  # fmt: skip
    parser.add_argument(
        "--then-validate", action="store_true",
        help="after fit: validate a new module from the checkpoint, then the fitted one",
    )  # fmt: skip
    arguments = parser.parse_args()
    seed_everything(0)
    train = _batches(arguments.batches, seed=1, size=8)
    # 9 validation samples: each rank holds them as the Trainer shards a DataLoader.
    validation = None
    if arguments.uneven_validation:
        from torch.utils.data import DataLoader, TensorDataset  # noqa: PLC0415

        x = torch.randn(9, WIDTH, generator=torch.Generator().manual_seed(2))
        validation = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=2)
    root: Path = arguments.root
    trainer = Trainer(
        strategy=_strategy(arguments),  # type: ignore[arg-type]
        accelerator=arguments.accelerator,
        devices=arguments.devices,
        precision=arguments.precision,
        max_epochs=arguments.epochs,
        default_root_dir=root,
        enable_progress_bar=False,
        logger=False,
        callbacks=[
            Measure(root, arguments.tag),
            *(
                []
                if arguments.no_checkpoints
                else [
                    ModelCheckpoint(
                        dirpath=root / "checkpoints",
                        save_last=True,
                        save_top_k=-1 if arguments.keep_every_epoch else 1,
                    )
                ]
            ),
        ],
        enable_checkpointing=not arguments.no_checkpoints,
    )
    model = Net(depth=arguments.depth, lazy=arguments.lazy, sgd=arguments.sgd)
    trainer.fit(model, train, validation, ckpt_path=arguments.resume_from)
    if arguments.then_validate:
        # What users do next. A module made anew, from the last checkpoint:
        fresh = Net(depth=arguments.depth, lazy=arguments.lazy)
        [metrics] = trainer.validate(fresh, train, ckpt_path="last")
        # The module fit sharded in place goes on as it is: the job's group outlived fit.
        [fitted] = trainer.validate(model, train)
        path = root / f"{arguments.tag}-rank{trainer.global_rank}.json"
        after = {
            "fresh_val_seen": metrics["val_seen"],
            "fresh_val_loss": metrics["val_loss"],
            "fitted_val_seen": fitted["val_seen"],
            "fitted_val_loss": fitted["val_loss"],
        }
        path.write_text(json.dumps({**json.loads(path.read_text()), **after}))
        return
    if not trainer.is_global_zero or arguments.no_checkpoints:
        return
    # The trained weights, from the last checkpoint: a sharded one is consolidated
    # into one file plain PyTorch loads.
    last = root / "checkpoints" / "last.ckpt"
    if last.is_dir():
        consolidate_checkpoint(last, root / "consolidated.pt", weights_only=True)
        last = root / "consolidated.pt"
    weights = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    final = {key: value.flatten().tolist() for key, value in weights.items()}
    (root / f"{arguments.tag}-final.json").write_text(json.dumps(final))


if __name__ == "__main__":
    main()
