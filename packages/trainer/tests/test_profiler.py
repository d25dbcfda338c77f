"""profiler="simple" | "advanced" | "pytorch": a report per run and rank."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import ConfigurationError
from plait.trainer import Module, Trainer
from plait.trainer.profiler import AdvancedProfiler, SimpleProfiler


def _loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    x = torch.randn(24, 3, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


class Profiled(Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)

    def distinctly_named_step_work(self, batch: object) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        return self.distinctly_named_step_work(batch)

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        self.log("val_loss", self.distinctly_named_step_work(batch))

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path: Path, profiler: object, module: Module | None = None) -> Trainer:
    trainer = Trainer(
        accelerator="cpu",
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        logger=False,
        max_epochs=2,
        profiler=profiler,  # type: ignore[arg-type]
    )
    trainer.fit(module or Profiled(), _loader(), _loader())
    return trainer


def _rows(report: str) -> dict[str, int]:
    rows = {}
    for line in report.splitlines()[1:-1]:
        name, calls = line.split()[:2]
        rows[name] = int(calls)
    return rows


def test_the_simple_profiler_writes_a_table_of_every_step_and_hook(tmp_path: Path) -> None:
    _fit(tmp_path, "simple")

    report = (tmp_path / "profiles" / "fit-rank0-simple.txt").read_text()
    rows = _rows(report)
    assert report.splitlines()[0].split() == [
        "region",
        "calls",
        "total",
        "s",
        "mean",
        "ms",
        "share",
    ]
    # 6 batches an epoch, 2 epochs; validation at each epoch's end.
    assert rows["run_training_epoch"] == 2
    for region in ("run_training_batch", "training_step", "backward", "optimizer_step"):
        assert rows[region] == 12, region
    assert rows["[Hooks]on_train_batch_end"] == 12
    assert rows["[Hooks]on_before_optimizer_step"] == 12
    assert rows["run_validation"] == 2
    assert rows["validation_step"] == 12
    assert rows["save_checkpoint"] == 2  # ModelCheckpoint, at each epoch's end
    assert "whole run" in report.splitlines()[-1]


def test_the_advanced_profiler_writes_cprofile_statistics_per_region(tmp_path: Path) -> None:
    _fit(tmp_path / "named", "advanced")
    assert (tmp_path / "named" / "profiles" / "fit-rank0-advanced.txt").exists()

    profiler = AdvancedProfiler(lines=1000)
    _fit(tmp_path, profiler)

    report = (tmp_path / "profiles" / "fit-rank0-advanced.txt").read_text()
    assert "Profile of region run_training_epoch" in report
    # Used, it still travels to spawned ranks with its trainer.
    assert isinstance(pickle.loads(pickle.dumps(profiler)), AdvancedProfiler)
    assert "distinctly_named_step_work" in report  # the user's code, inside the epoch
    # Regions inside an epoch count in it: cProfile does not nest.
    assert "Profile of region training_step" not in report


def test_the_pytorch_profiler_writes_a_trace_with_the_regions(tmp_path: Path) -> None:
    _fit(tmp_path, "pytorch")

    traces = list((tmp_path / "profiles" / "fit").glob("rank0*.pt.trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    assert {"training_step", "backward", "optimizer_step"} <= names
    assert "aten::addmm" in names  # and the operators inside them


def test_a_profiler_object_is_used_as_given(tmp_path: Path) -> None:
    mine = SimpleProfiler()

    trainer = _fit(tmp_path, mine)

    assert trainer.profiler is mine
    assert len(mine.durations["training_step"]) == 12


def test_an_unknown_profiler_name_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="'simpel'") as raised:
        Trainer(accelerator="cpu", logger=False, profiler="simpel")
    assert raised.value.suggestion == "simple"


class ManualProfiled(Profiled):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        assert not isinstance(optimizer, list)
        optimizer.zero_grad()
        loss = self.distinctly_named_step_work(batch)
        self.manual_backward(loss)
        optimizer.step()
        return loss


def test_the_simple_profiler_times_a_manual_step_and_its_optimizer_steps(tmp_path: Path) -> None:
    _fit(tmp_path, "simple", ManualProfiled())

    rows = _rows((tmp_path / "profiles" / "fit-rank0-simple.txt").read_text())
    for region in ("run_training_batch", "training_step", "optimizer_step"):
        assert rows[region] == 12, region
    assert rows["[Hooks]on_before_optimizer_step"] == 12
