"""plait fit|validate|test|predict with your own module, configured on jsonargparse."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.trainer import DataModule, Module
from plait.trainer.cli import cli, main


class Regressor(Module):
    """A small regressor.

    Args:
        width: Units in the hidden layer.
        lr: The learning rate.
    """

    def __init__(self, width: int = 8, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(3, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
        )

    def _loss(self, batch: object) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        return self._loss(batch)

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))

    @override
    def test_step(self, batch: object, batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch))

    @override
    def predict_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        out: torch.Tensor = self.net(batch[0])
        return out

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Data(DataModule):
    """Random regression data.

    Args:
        size: Samples.
        batch_size: Samples per batch.
    """

    def __init__(self, size: int = 32, batch_size: int = 8) -> None:
        super().__init__()
        x = torch.randn(size, 3, generator=torch.Generator().manual_seed(0))
        self.data = TensorDataset(x, x.sum(dim=1, keepdim=True))
        self.batch_size = batch_size

    @override
    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)

    @override
    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return DataLoader(self.data, batch_size=self.batch_size)

    @override
    def test_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return DataLoader(self.data, batch_size=self.batch_size)

    @override
    def predict_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return DataLoader(self.data, batch_size=self.batch_size)


MODEL = f"{__name__}.Regressor"
DATA = f"{__name__}.Data"


def _quiet(root: Path) -> list[str]:
    return [
        *("--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false"),
        *("--trainer.default_root_dir", str(root), "--trainer.max_epochs", "1"),
    ]


def _last(root: Path) -> Path:
    return root / "checkpoints" / "last.ckpt"


def test_fit_then_test_and_predict_a_module_named_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = ["--model", MODEL, "--model.width", "4", "--data", DATA, *_quiet(tmp_path)]

    assert main(["fit", *given]) == 0
    assert Regressor.load_from_checkpoint(_last(tmp_path)).hparams == {"width": 4, "lr": 0.1}
    assert "fit: val_loss=" in capsys.readouterr().out

    assert main(["test", *given, "--ckpt_path", str(_last(tmp_path))]) == 0
    assert "test: test_loss=" in capsys.readouterr().out
    assert main(["predict", *given, "--ckpt_path", str(_last(tmp_path))]) == 0


def test_print_config_reproduces_the_run_and_configs_compose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = ["--model", MODEL, "--model.width", "6", "--data", DATA, *_quiet(tmp_path / "a")]
    with pytest.raises(SystemExit) as printed:
        main(["fit", *given, "--print_config"])
    assert printed.value.code == 0
    first = tmp_path / "run.yaml"
    first.write_text(capsys.readouterr().out)
    assert "class_path: " + MODEL in first.read_text()
    # A second file and the command line override the first, in that order.
    second = tmp_path / "more.yaml"
    second.write_text(
        f"model:\n  init_args:\n    lr: 0.05\ntrainer:\n  default_root_dir: {tmp_path}\n"
    )

    assert main(["fit", "--config", str(first), "--config", str(second), "--model.width", "5"]) == 0

    loaded = Regressor.load_from_checkpoint(_last(tmp_path))
    assert loaded.hparams == {"width": 5, "lr": 0.05}


def test_a_strategy_is_a_name_or_a_class_with_its_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = ["--model", MODEL, "--data", DATA, *_quiet(tmp_path)]
    strategy = ["--trainer.strategy", "SingleDeviceStrategy"]
    strategy += ["--trainer.strategy.init_args.device", "cpu"]

    assert main(["fit", *given, *strategy]) == 0
    assert main(["fit", *given, "--trainer.strategy", "single_device"]) == 0
    # Keywords a strategy passes on (DDP's to DistributedDataParallel) are dict_kwargs.
    assert main(["fit", *given, "--trainer.strategy", "DDPStrategy",
                 "--trainer.strategy.init_args.static_graph", "true"]) == 2  # fmt: skip
    assert "...dict_kwargs.static_graph VALUE" in capsys.readouterr().err


def test_a_main_py_of_your_own_runs_its_classes(tmp_path: Path) -> None:
    assert cli(Regressor, Data, ["fit", "--model.width", "3", *_quiet(tmp_path)]) == 0

    assert Regressor.load_from_checkpoint(_last(tmp_path)).hparams.width == 3


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (["--trainer.max_epoch", "2"], "did you mean --trainer.max_epochs?"),
        (["--model.widht", "3"], "Regressor has no argument 'widht'; did you mean 'width'?"),
        (["--trainer.max_epochs", "many"], 'Parser key "trainer.max_epochs"'),
        (["--data", f"{__name__}.Missing"], "has no attribute 'Missing'"),
    ],
)  # fmt: skip
def test_a_wrong_option_says_what_is_wrong_and_exits_2(
    given: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fit", "--model", MODEL, *given]) == 2

    error = capsys.readouterr().err
    assert error.startswith("plait: error:")
    assert says in error


def test_help_gives_every_option_its_type_and_docstring(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--model", MODEL, "--help"])

    shown = " ".join(capsys.readouterr().out.split())
    assert "--trainer.max_epochs MAX_EPOCHS Stop after this many epochs" in shown
    assert "--trainer.strategy STRATEGY" in shown
    assert "--model CONFIG | CLASS_PATH_OR_NAME" in shown
