"""``xla_fsdp`` jobs, each in an interpreter of its own (SPMD is a switch of the process).

Run as ``python spmd_job.py <job> <directory>`` with ``PJRT_DEVICE=CPU`` and
``CPU_NUM_DEVICES``; writes what the test checks to ``<directory>/result.json``.
"""

from __future__ import annotations

import importlib
import json
import sys
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import seed_everything
from plait.strategies import SingleDeviceStrategy, XLAFSDPStrategy
from plait.trainer import ModelCheckpoint, Module, Trainer

# torch_xla's SPMD planner and wrapper warn of their own internals on every call.
warnings.filterwarnings("ignore", module="torch_xla")
warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")

STEPS = 24


def loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    """64 rows of a linear target, in shuffled batches of 8."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=generator)
    y = x @ torch.linspace(-1.0, 1.0, 12).reshape(6, 2)
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)


class Regressor(Module):
    """Two linear layers whose parameters shard along their larger dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)
        )
        self.losses: list[float] = []
        self.shardings: set[str] = set()

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.item())
        return loss

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def _sharding(tensor: torch.Tensor) -> str:
    # torch_xla's own account of how the tensor is laid out over the devices.
    bindings = importlib.import_module("torch_xla")._XLAC
    spec: str = bindings._get_xla_sharding_spec(tensor)
    return spec


def fit(
    root: Path, strategy: object, ckpt_path: str | None = None, **settings: object
) -> Regressor:
    """Train a fresh model (seeded alike) with ``strategy``."""
    seed_everything(7)
    model = Regressor()
    trainer = Trainer(
        strategy=strategy,  # type: ignore[arg-type]
        default_root_dir=root,
        enable_progress_bar=False,
        logger=False,
        **settings,  # type: ignore[arg-type]
    )
    trainer.fit(model, loader(), ckpt_path=ckpt_path)
    model.shardings = {_sharding(p) for p in model.parameters() if p.device.type == "xla"}
    return model


def weights(model: torch.nn.Module) -> dict[str, list[float]]:
    """Every parameter, flattened, on the CPU."""
    return {name: p.detach().cpu().flatten().tolist() for name, p in model.named_parameters()}


def main(job: str, root: Path) -> dict[str, object]:
    """Run ``job``; return what the test checks."""
    if job == "equal":
        # XLA first: torch's autograd engine counts the devices of a type at its first
        # backward pass, and one run on the CPU before would leave XLA's uncounted.
        sharded = fit(root / "fsdp", "xla_fsdp", max_steps=STEPS, enable_checkpointing=False)
        reference = fit(
            root / "cpu", SingleDeviceStrategy("cpu"), max_steps=STEPS, accelerator="cpu", devices=1
        )
        return {
            "losses": sharded.losses,
            "reference_losses": reference.losses,
            "weights": weights(sharded),
            "reference_weights": weights(reference),
            "shardings": sorted(sharded.shardings),
        }
    if job == "resume":
        stop = int(sys.argv[3])
        whole = fit(root / "whole", "xla_fsdp", max_steps=STEPS, enable_checkpointing=False)

        def every() -> ModelCheckpoint:
            return ModelCheckpoint(root / "ckpt", every_n_train_steps=stop, save_top_k=-1)

        first = fit(root / "part", "xla_fsdp", max_steps=stop, callbacks=[every()])
        seed_everything(123)  # the resumed run restores the random state
        resumed = fit(
            root / "part", "xla_fsdp", ckpt_path="last", max_steps=STEPS, callbacks=[every()]
        )
        saved = sorted(p.name for p in (root / "ckpt").iterdir())
        from plait.checkpoint_io import DistributedCheckpointIO  # noqa: PLC0415

        last = DistributedCheckpointIO().load_checkpoint(root / "ckpt" / "last.ckpt")
        state = last["state_dict"]
        assert isinstance(state, dict)
        return {
            "losses": first.losses + resumed.losses,
            "whole_losses": whole.losses,
            "weights": weights(resumed),
            "whole_weights": weights(whole),
            "saved": saved,
            "last_is_directory": (root / "ckpt" / "last.ckpt" / ".metadata").is_file(),
            "last_weights": {name: value.flatten().tolist() for name, value in state.items()},
            "shardings": sorted(resumed.shardings),
        }
    if job == "full":
        model = fit(root, XLAFSDPStrategy(state_dict_type="full"), max_steps=8)
        path = root / "checkpoints" / "last.ckpt"
        checkpoint = torch.load(path, weights_only=True)
        return {
            "is_file": path.is_file(),
            "devices": sorted({t.device.type for t in checkpoint["state_dict"].values()}),
            "match": all(
                torch.equal(checkpoint["state_dict"][name], p.detach().cpu())
                for name, p in model.named_parameters()
            ),
        }
    raise SystemExit(f"unknown job {job!r}")


if __name__ == "__main__":
    directory = Path(sys.argv[2])
    found = main(sys.argv[1], directory)
    (directory / "result.json").write_text(json.dumps(found))
