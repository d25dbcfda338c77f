"""Training jobs with DeepSpeedStrategy (or DDP, to compare), as a user writes them.

    python deepspeed_job.py ROOT TAG --strategy deepspeed_stage_2 --devices 2 [options]

Every rank gets the same batches (a list, which the Trainer does not shard), so a
run's trajectory does not depend on the world size and DDP's is the reference. Each
rank writes ``ROOT/TAG-rank<r>.json``: losses by step, the bytes of the state it
holds, the largest update of a step (for the clipping bound), the dtype the model
computed in; rank 0 writes ``ROOT/TAG-final.json``, the trained weights exported
from the last checkpoint (consolidated to fp32, read by plain PyTorch).
"""

from __future__ import annotations

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import argparse
import json
import os
from pathlib import Path

import torch
from typing_extensions import override

from plait.core import StrategyRegistry, seed_everything
from plait.strategies import BaseStrategy, DDPStrategy, DeepSpeedStrategy
from plait.strategies.deepspeed import consolidate_checkpoint
from plait.strategies.deepspeed.library import import_deepspeed
from plait.trainer import Callback, ModelCheckpoint, Module, Trainer

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()

WIDTH = int(os.environ.get("DEEPSPEED_JOB_WIDTH", "16"))


class Net(Module):
    def __init__(self, *, depth: int, lazy: bool, optimizer: str = "adamw") -> None:
        super().__init__()
        self.depth = depth
        self.optimizer = optimizer
        self.layers: torch.nn.Sequential | None = None
        self.build_growth = 0
        if not lazy:
            self.configure_model()
        self.losses: dict[int, float] = {}
        self.dtypes: set[str] = set()

    @override
    def configure_model(self) -> None:
        if self.layers is None:
            # How far this process's resident memory rose above where it was, at its
            # peak while the model was built (the peak is reset first: an earlier,
            # higher one would hide the build).
            Path("/proc/self/clear_refs").write_text("5")
            before = _memory("VmRSS")
            layers: list[torch.nn.Module] = []
            for _ in range(self.depth):
                layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
            self.layers = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1))
            self.build_growth = _memory("VmHWM") - before

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.layers is not None
        self.dtypes.add(str(x.dtype))
        out: torch.Tensor = self.layers(x)
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
        loss = torch.nn.functional.mse_loss(self(x).float(), y)
        self.log("val_loss", loss, sync_dist=True)

    @override
    def configure_optimizers(self) -> object:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=1.0)
        return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.01)


def _memory(field: str) -> int:
    """A field of /proc/self/status, in bytes: VmRSS (resident now), VmHWM (its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Measure(Callback):
    """Records, on each rank, what that rank holds and how much each step moved."""

    def __init__(self, root: Path, tag: str) -> None:
        self.root, self.tag = root, tag
        self.state_bytes: dict[str, int] = {}
        self.before: list[torch.Tensor] | None = None
        self.updates: list[float] = []

    def _weights(self, trainer: Trainer) -> list[torch.Tensor]:
        strategy = trainer.strategy
        if isinstance(strategy, DeepSpeedStrategy):
            module = strategy.engine.module
            if strategy.stage == 3:
                parameters = list(module.parameters())
                with import_deepspeed().zero.GatheredParameters(parameters):
                    return [p.detach().float().clone() for p in parameters]
            return [p.detach().float().clone() for p in module.parameters()]
        assert isinstance(strategy, BaseStrategy)
        model = strategy.model
        assert model is not None
        return [p.detach().float().clone() for p in model.parameters()]

    @override
    def on_before_optimizer_step(
        self, trainer: Trainer, module: Module, optimizer: torch.optim.Optimizer
    ) -> None:
        self.before = self._weights(trainer)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        if self.before is None:
            return
        after = self._weights(trainer)
        delta = torch.cat([(a - b).flatten() for a, b in zip(after, self.before, strict=True)])
        self.updates.append(float(delta.norm()))
        self.before = None
        strategy = trainer.strategy
        if isinstance(strategy, DeepSpeedStrategy):
            # ZeRO's optimizer wraps the user's, whose state holds this rank's partitions.
            wrapper = strategy.engine.optimizer
            inner = getattr(wrapper, "optimizer", wrapper)
            assert isinstance(inner, torch.optim.Optimizer)
            held = [
                value
                for state in inner.state.values()
                for value in state.values()
                if isinstance(value, torch.Tensor) and value.dim() > 0
            ]
            local = [getattr(p, "ds_tensor", p) for p in strategy.engine.module.parameters()]
        else:
            optimizer = trainer.optimizers[0]
            held = [
                value
                for state in optimizer.state.values()
                for value in state.values()
                if isinstance(value, torch.Tensor) and value.dim() > 0
            ]
            assert isinstance(strategy, BaseStrategy)
            model = strategy.model
            assert model is not None
            local = list(model.parameters())
        self.state_bytes = {"optimizer": _bytes(held), "parameters": _bytes(local)}

    @override
    def on_fit_end(self, trainer: Trainer, module: Module) -> None:
        assert isinstance(module, Net)
        result = {
            "losses": {str(step): loss for step, loss in module.losses.items()},
            "state_bytes": self.state_bytes,
            "updates": self.updates,
            "dtypes": sorted(module.dtypes),
            "global_step": trainer.global_step,
            "build_growth": module.build_growth,
            "model_bytes": sum(p.numel() for p in module.parameters()) * 4
            if trainer.strategy.__class__ is not DeepSpeedStrategy
            else int(sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters()) * 4),
        }
        path = self.root / f"{self.tag}-rank{trainer.global_rank}.json"
        path.write_text(json.dumps(result))


def _batches(count: int, seed: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        x = torch.randn(size, WIDTH, generator=generator)
        batches.append((x, torch.sin(x.sum(dim=1, keepdim=True))))
    return batches


# The ranks are forked from this process, which has imported torch, plait, DeepSpeed
# and the torch._dynamo its engine imports at set-up once (each rank would import them
# again, seconds of CPU apiece, if started anew). The launchers themselves are tested
# in tests/reliability and by the command line's tests. On a GPU the default stands:
# a forked process cannot use the CUDA its parent may have started.


def _strategy(arguments: argparse.Namespace) -> object:
    # After fit, --then-validate goes on in every rank's program, as the default
    # launcher runs it: forked ranks would leave it to this process alone.
    forked = arguments.accelerator == "cpu" and not arguments.then_validate
    fork: dict[str, object] = {"start_method": "fork"} if forked else {}
    if arguments.strategy == "ddp":
        return DDPStrategy(**fork)  # type: ignore[arg-type]
    import torch._dynamo  # noqa: F401, PLC0415

    import_deepspeed(arguments.accelerator)
    options: dict[str, object] = json.loads(arguments.options)
    if arguments.strategy == "deepspeed":
        return DeepSpeedStrategy(**fork, **options)  # type: ignore[arg-type]
    return StrategyRegistry.get(arguments.strategy, **fork, **options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("tag")
    parser.add_argument("--strategy", default="deepspeed_stage_2")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--precision", default=None)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--lazy", action="store_true", help="build under model_sharded_context")
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--then-validate", action="store_true")
    parser.add_argument("--no-export", action="store_true", help="skip writing the weights")
    parser.add_argument(
        "--keep-every-epoch", action="store_true",
        help="keep every epoch's checkpoint, not only the newest",
    )  # fmt: skip
    arguments = parser.parse_args()
    seed_everything(0)
    train = _batches(arguments.batches, seed=1, size=arguments.batch_size)
    root: Path = arguments.root
    trainer = Trainer(
        strategy=_strategy(arguments),  # type: ignore[arg-type]
        accelerator=arguments.accelerator,
        devices=arguments.devices,
        precision=arguments.precision,
        max_epochs=arguments.epochs,
        accumulate_grad_batches=arguments.accumulate,
        gradient_clip_val=arguments.clip,
        default_root_dir=root,
        enable_progress_bar=False,
        logger=False,
        callbacks=[
            Measure(root, arguments.tag),
            ModelCheckpoint(
                dirpath=root / "checkpoints",
                save_last=True,
                save_top_k=-1 if arguments.keep_every_epoch else 1,
            ),
        ],
    )
    model = Net(depth=arguments.depth, lazy=arguments.lazy, optimizer=arguments.optimizer)
    trainer.fit(model, train, ckpt_path=arguments.resume_from)
    if arguments.then_validate:
        # What users do next: a module made anew, from the last checkpoint, and the
        # fitted one itself.
        fresh = Net(depth=arguments.depth, lazy=arguments.lazy)
        [from_checkpoint] = trainer.validate(fresh, train, ckpt_path="last")
        # The fitted module goes on as it is (partitioned in place at stage 3): the
        # job's group outlived fit.
        [fitted] = trainer.validate(model, train)
        path = root / f"{arguments.tag}-rank{trainer.global_rank}.json"
        after = {
            "val_from_checkpoint": from_checkpoint["val_loss"],
            "val_fitted": fitted["val_loss"],
        }
        path.write_text(json.dumps({**json.loads(path.read_text()), **after}))
    if not trainer.is_global_zero or arguments.no_export:
        return
    last = root / "checkpoints" / "last.ckpt"
    if last.is_dir():
        consolidate_checkpoint(last, root / "consolidated.pt")
        last = root / "consolidated.pt"
    weights = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    final = {key: value.float().flatten().tolist() for key, value in weights.items()}
    (root / f"{arguments.tag}-final.json").write_text(json.dumps(final))


if __name__ == "__main__":
    main()
