"""Trainer(compile=...): the module's forward compiled in place, in every run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import ConfigurationError, seed_everything
from plait.trainer import Module, Trainer

# torch.compile's graphs without a C++ compiler: dynamo and AOT autograd.
EAGER = {"backend": "aot_eager"}


def _loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


class Regressor(Module):
    def __init__(self) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
        self.losses: list[float] = []

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


def _fit(tmp_path: Path, **settings: object) -> tuple[Trainer, Regressor]:
    seed_everything(0)
    model = Regressor()
    options: dict[str, object] = {
        "accelerator": "cpu",
        "default_root_dir": tmp_path,
        "enable_progress_bar": False,
        "logger": False,
        "max_epochs": 3,
        **settings,
    }
    trainer = Trainer(**options)  # type: ignore[arg-type]
    trainer.fit(model, _loader())
    return trainer, model


def test_a_compiled_module_trains_as_the_eager_one(tmp_path: Path) -> None:
    _, eager = _fit(tmp_path / "eager")
    trainer, compiled = _fit(tmp_path / "compiled", compile=EAGER)

    assert compiled._compiled_call_impl is not None  # the run compiled it in place
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-5)
    # Its checkpoint holds the module's own names, and loads into a module never compiled.
    assert trainer.checkpoint_callback is not None
    loaded = Regressor.load_from_checkpoint(trainer.checkpoint_callback.last_model_path)
    assert loaded._compiled_call_impl is None
    assert set(loaded.state_dict()) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    for name, value in compiled.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value)


def test_torch_compiles_wrapper_is_refused_with_the_in_place_ways(tmp_path: Path) -> None:
    wrapped = torch.compile(Regressor(), backend="aot_eager")
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)

    with pytest.raises(ConfigurationError, match=r"_orig_mod") as raised:
        trainer.fit(wrapped, _loader())  # type: ignore[arg-type]
    assert "Trainer(compile=True)" in str(raised.value)


@pytest.mark.parametrize(
    ("given", "says"),
    [("yes", "compile='yes'"), ({"mdoe": "max-autotune"}, "'mdoe'")],
)
def test_bad_compile_options_are_refused(given: object, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        Trainer(accelerator="cpu", logger=False, compile=given)  # type: ignore[arg-type]
