"""Checkpoints between plait's Trainer and Lightning's: what each reads of the other's.

The Lightning checkpoint here is built as Lightning 2.6.6's Trainer writes one
after two epochs of two batches (its keys and its loops' progress, as read from
such a file), so that the test needs no Lightning installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.trainer import Callback, Module, Trainer
from plait.trainer.checkpointing import LIGHTNING_LAYOUT, LIGHTNING_VERSION_KEY


class Scheduled(Module):
    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(2, 1)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    @override
    def configure_optimizers(self) -> object:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class AtStart(Callback):
    """What the run resumed with: the momentum and the learning rate at its start."""

    momentum: torch.Tensor | None = None
    lr: float | None = None

    @override
    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        [optimizer] = trainer.optimizers
        assert isinstance(module, Scheduled)
        self.momentum = optimizer.state[module.layer.weight]["momentum_buffer"].clone()
        self.lr = optimizer.param_groups[0]["lr"]


def _loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4, 2, generator=generator), torch.randn(4, 1))
    return DataLoader(data, batch_size=2)


def _trainer(tmp_path: Path, **settings: object) -> Trainer:
    options: dict[str, object] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_progress_bar": False,
        "default_root_dir": tmp_path,
        **settings,
    }
    return Trainer(**options)  # type: ignore[arg-type]


def _progress(total: int, current: int) -> dict[str, int]:
    return {"ready": total, "completed": current, "started": total, "processed": total}


def _lightning_checkpoint(module: Scheduled, epochs: int, batches: int) -> dict[str, object]:
    """What Lightning's Trainer saves after ``epochs`` epochs of ``batches`` batches."""
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    for _ in range(epochs * batches):  # momentum to carry over
        module.layer(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    for _ in range(epochs):
        scheduler.step()
    steps = epochs * batches
    return {
        "epoch": epochs - 1,
        "global_step": steps,
        LIGHTNING_VERSION_KEY: "2.6.6",
        "state_dict": module.state_dict(),
        "loops": {
            "fit_loop": {
                "state_dict": {},
                "epoch_loop.state_dict": {"_batches_that_stepped": steps},
                "epoch_loop.batch_progress": {
                    "total": _progress(steps, steps),
                    "current": _progress(batches, batches),
                    "is_last_batch": True,
                },
                "epoch_progress": {
                    "total": _progress(epochs, epochs - 1),
                    "current": _progress(epochs, epochs - 1),
                },
            },
        },
        "callbacks": {
            "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, "
            "'every_n_epochs': 1, 'train_time_interval': None}": {"best_model_path": "x.ckpt"}
        },
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [scheduler.state_dict()],
        "hparams_name": "kwargs",
        "hyper_parameters": {"width": 5},
    }


def test_a_fit_resumes_from_a_checkpoint_lightnings_trainer_wrote(tmp_path: Path) -> None:
    saved = Scheduled(width=5)
    path = tmp_path / "lightning.ckpt"
    torch.save(_lightning_checkpoint(saved, epochs=2, batches=2), path)
    model = Scheduled.load_from_checkpoint(path)
    assert model.hparams == {"width": 5}
    start = AtStart()
    trainer = _trainer(tmp_path, max_epochs=3, enable_checkpointing=False, callbacks=[start])

    with pytest.warns(UserWarning, match=r"written by Lightning 2\.6\.6: its callbacks' states"):
        trainer.fit(model, _loader(), ckpt_path=path)

    assert (trainer.global_step, trainer.current_epoch) == (6, 3)  # one more epoch, after 4 steps
    expected = _lightning_checkpoint(Scheduled(), epochs=2, batches=2)["optimizer_states"]
    assert isinstance(expected, list)
    state = expected[0]["state"][0]  # the weight's (its gradient never depends on it)
    assert start.momentum is not None
    assert torch.equal(start.momentum, state["momentum_buffer"])  # the optimizer's state
    assert start.lr == pytest.approx(0.1 * 0.1**2)  # the scheduler's, after two epochs


def test_a_trainer_checkpoint_holds_the_entries_lightnings_tooling_reads(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(Scheduled(width=5), _loader())

    read = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)

    assert read[LIGHTNING_VERSION_KEY] == LIGHTNING_LAYOUT
    assert (read["epoch"], read["global_step"]) == (1, 4)
    assert read["hyper_parameters"] == {"width": 5}
    torch.nn.Linear(2, 1).load_state_dict(
        {key.removeprefix("layer."): value for key, value in read["state_dict"].items()}
    )
    assert len(read["optimizer_states"]) == len(read["lr_schedulers"]) == 1
    assert list(read["callbacks"]) == ["ModelCheckpoint{monitor=None, mode='min'}"]
    # A checkpoint of plait's own is read as it is, never as Lightning's.
    trainer = _trainer(tmp_path, max_epochs=3)
    trainer.fit(Scheduled(width=5), _loader(), ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    assert trainer.global_step == 6
