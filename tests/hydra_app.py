"""A Hydra app that trains on ``ddp`` over two CPU processes, as a Lightning template's does.

    python hydra_app.py lr=0.2 'hydra.run.dir=outputs/${now:%H-%M-%S-%f}'

Every rank writes, into the run's folder Hydra gave it, what it ran with:
``rank-N.json`` (its folder, the learning rate it was given, its job name).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.trainer import Module, Trainer

if TYPE_CHECKING:
    from omegaconf import DictConfig

ConfigStore.instance().store(name="app", node={"lr": 0.1, "epochs": 1})


class Tiny(Module):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.lr = lr

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


@hydra.main(version_base=None, config_name="app")
def main(config: DictConfig) -> None:
    trainer = Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=int(config.epochs),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    trainer.fit(Tiny(float(config.lr)), DataLoader(data, batch_size=2))
    hydra_config = HydraConfig.get()
    output = Path(hydra_config.runtime.output_dir)
    (output / f"rank-{trainer.global_rank}.json").write_text(
        json.dumps(
            {
                "output_dir": str(output),
                "cwd": os.getcwd(),
                "lr": float(config.lr),
                "job": hydra_config.job.name,
            }
        )
    )


if __name__ == "__main__":
    main()
