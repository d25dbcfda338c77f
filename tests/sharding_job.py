"""A small sharding strategy written against plait's seams, and a job that trains with it.

    python sharding_job.py ROOT MAX_EPOCHS [PRECISION] [--resume]

`FullyShardedExample` is what a third party writes to bring a sharding library to
plait (here torch's FSDP2, ``fully_shard``): it meets each seam once. The Trainer
never sees the shards: it trains, validates on data the ranks hold unevenly (every
forward of a sharded module is collective), checkpoints and resumes through the
strategy. Rank 0 writes ``result-EPOCHS.json``: the losses by step, and what the
strategy derived from the precision plugin.
"""

from __future__ import annotations

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import GradientClipAlgorithm, seed_everything
from plait.strategies import DDPStrategy
from plait.trainer import Module, Trainer

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint

# The sharded strategies' saves import it: here it comes under the pause.
import torch.distributed.checkpoint

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()


def _maker(optimizer: torch.optim.Optimizer) -> Callable[..., torch.optim.Optimizer]:
    return type(optimizer)


class FullyShardedExample(DDPStrategy):
    """FSDP2 over plait's seams (DDP's launcher and process group, its own everything else).

    - wrapping: `configure_ddp` shards the module, its mixed-precision policy derived
      from the precision plugin's dtypes;
    - joint set-up: sharding replaces the parameters, so the optimizers are made again
      over the new ones, group by group;
    - state: torch's `get_state_dict` / `set_state_dict` gather and scatter the shards;
    - clipping: by the norm of every shard together.
    """

    policy: MixedPrecisionPolicy | None = None

    @override
    def configure_ddp(self, module: torch.nn.Module) -> torch.nn.Module:
        precision = self.precision
        self.policy = MixedPrecisionPolicy(
            param_dtype=precision.compute_dtype, reduce_dtype=precision.reduce_dtype
        )
        fully_shard(module, mp_policy=self.policy)
        return module

    @override
    def setup_module_and_optimizers(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> tuple[torch.nn.Module, list[torch.optim.Optimizer]]:
        names = {id(parameter): name for name, parameter in module.named_parameters()}
        groups = [
            [
                {**group, "params": [names[id(p)] for p in group["params"]]}
                for group in o.param_groups
            ]
            for o in optimizers
        ]
        wrapped = self.setup_module(module)
        sharded = dict(wrapped.named_parameters())
        # Each group carries every hyper-parameter: the groups alone make the optimizer.
        remade = [
            _maker(optimizer)(
                [{**group, "params": [sharded[name] for name in group["params"]]} for group in kept]
            )
            for optimizer, kept in zip(optimizers, groups, strict=True)
        ]
        return wrapped, remade

    @override
    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optimizer_state = get_state_dict(module, list(optimizers), options=options)
        return {
            "state_dict": model_state,
            "optimizer_states": [optimizer_state] if optimizers else [],
            "precision": self.precision.state_dict(),
        }

    @override
    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        options = StateDictOptions(full_state_dict=True)
        model_state, optimizer_states = state["state_dict"], state["optimizer_states"]
        assert isinstance(model_state, dict)
        assert isinstance(optimizer_states, list)
        set_state_dict(
            module,
            list(optimizers),
            model_state_dict=model_state,
            optim_state_dict=optimizer_states[0] if optimizers else {},
            options=options,
        )

    @override
    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> None:
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(parameters, clip_val)


class Regression(Module):
    def __init__(self, result: Path) -> None:
        super().__init__()
        self.result = result
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.losses: dict[int, float] = {}

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        loss: torch.Tensor = torch.nn.functional.mse_loss(self.net(x).float(), y)
        self.losses[self.trainer.global_step] = float(loss.detach())
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        assert isinstance(batch, list)
        x, _ = batch
        self.log("val_seen", len(x), reduce_fx="sum", sync_dist=True)

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    @override
    def on_fit_end(self) -> None:
        # Inside the rank, where the strategy that trained is.
        trainer = self.trainer
        strategy = trainer.strategy
        assert isinstance(strategy, FullyShardedExample)
        assert strategy.policy is not None
        if trainer.is_global_zero:
            result = {
                "losses": {str(step): loss for step, loss in self.losses.items()},
                "val_seen": trainer.callback_metrics["val_seen"],
                "param_dtype": str(strategy.policy.param_dtype),
                "reduce_dtype": str(strategy.policy.reduce_dtype),
            }
            self.result.write_text(json.dumps(result))


def main() -> None:
    root, epochs, *rest = sys.argv[1:]
    resume = "--resume" in rest
    precision = next((arg for arg in rest if not arg.startswith("--")), "32-true")
    seed_everything(0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=generator)
    train = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4, shuffle=True)
    # 9 samples in batches of 2: rank 0 holds 3 batches, rank 1 holds 2.
    val = DataLoader(TensorDataset(x[:9], x[:9].sum(dim=1, keepdim=True)), batch_size=2)
    strategy = FullyShardedExample()
    trainer = Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        precision=precision,
        max_epochs=int(epochs),
        gradient_clip_val=1.0,
        default_root_dir=root,
        enable_progress_bar=False,
        logger=False,
    )
    model = Regression(Path(root, f"result-{epochs}.json"))
    trainer.fit(model, train, val, ckpt_path="last" if resume else None)
    # The caller's module holds the trained state, gathered from the shards.
    assert set(model.state_dict()) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}


if __name__ == "__main__":
    main()
