import importlib
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import torch
from typing_extensions import override

from plait.core import CheckpointError, CheckpointIO
from plait.core.typing import Checkpoint, PathLike
from plait.strategies import CheckpointIO as CheckpointIOBase
from plait.strategies import SingleDeviceStrategy
from plait.strategies.state import optimizer_states_of


class JustSaveAndLoad(CheckpointIOBase):
    """A checkpoint IO as Lightning's examples write one: no map_location."""

    def __init__(self) -> None:
        self.saved: dict[str, Checkpoint] = {}

    @override
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        self.saved[str(path)] = dict(checkpoint)
        Path(path).write_text("saved")

    @override
    def load_checkpoint(self, path: PathLike) -> Checkpoint:  # type: ignore[override]
        return self.saved[str(path)]


def test_a_subclass_writing_save_and_load_only_is_a_whole_checkpoint_io(tmp_path: Path) -> None:
    io = JustSaveAndLoad()
    assert isinstance(io, CheckpointIO)
    strategy = SingleDeviceStrategy("cpu", checkpoint_io=io)
    path = tmp_path / "a.ckpt"

    strategy.save_checkpoint({"step": 3}, path)
    assert strategy.load_checkpoint(path) == {"step": 3}  # called without map_location
    strategy.remove_checkpoint(path)

    assert not path.exists()
    with pytest.raises(CheckpointError, match="it does not exist"):
        io.remove_checkpoint(path)


def test_remote_paths_ask_for_a_remove_of_ones_own() -> None:
    with pytest.raises(CheckpointError, match=r"override JustSaveAndLoad\.remove_checkpoint"):
        JustSaveAndLoad().remove_checkpoint("s3://bucket/a.ckpt")


def test_save_and_load_must_be_written() -> None:
    with pytest.raises(TypeError, match="abstract"):
        CheckpointIOBase()  # type: ignore[abstract]


def _adam_after_a_step() -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    module(torch.randn(4, 3)).pow(2).sum().backward()
    optimizer.step()
    return module, optimizer


def test_optimizer_moments_survive_a_distributed_checkpoint(tmp_path: Path) -> None:
    # DCP writes mapping keys as strings: Adam's per-parameter state comes back keyed
    # "0", "1". Loaded so, it would sit beside the parameters' state, unused.
    module, optimizer = _adam_after_a_step()
    strategy = SingleDeviceStrategy("cpu", checkpoint_io="distributed")
    strategy.save_checkpoint({"model": module, "optimizer": optimizer}, tmp_path / "ckpt")

    fresh = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.1)
    left = strategy.load_checkpoint(
        tmp_path / "ckpt", {"model": fresh, "optimizer": fresh_optimizer}
    )
    assert left == {}

    restored = fresh_optimizer.state_dict()["state"]
    saved = optimizer.state_dict()["state"]
    assert set(restored) == {0, 1}
    for index in (0, 1):
        assert torch.equal(restored[index]["exp_avg"], saved[index]["exp_avg"])
        assert torch.equal(restored[index]["exp_avg_sq"], saved[index]["exp_avg_sq"])
    # The next step is the one the original optimizer takes.
    for model, opt in ((module, optimizer), (fresh, fresh_optimizer)):
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    assert torch.equal(fresh.weight, module.weight)


def test_state_keyed_by_name_keeps_its_keys() -> None:
    named = {"state": {"0": {"step": 1}}, "param_groups": [{"params": ["0"]}]}
    indexed = {"state": {"0": {"step": 1}}, "param_groups": [{"params": [0]}]}

    by_name, by_index = optimizer_states_of({"optimizer_states": [named, indexed]}, 2, "x")

    assert list(by_name["state"]) == ["0"]
    assert list(by_index["state"]) == [0]


def test_a_read_detects_the_format_once_and_reads_the_io_s_signature_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read is decided in Checkpoints once: the format detected once per read, the
    # strategy asked only for its own in-place read (never back through its
    # read_checkpoint), and the IO's load_checkpoint signature looked up once per IO.
    checkpoints_module = importlib.import_module("plait.strategies.checkpoints")
    detected: list[str] = []
    detect = checkpoints_module.detect_checkpoint_format

    def counting_detect(path: PathLike) -> object:
        detected.append(str(path))
        return detect(path)

    signatures: list[object] = []
    signature = inspect.signature

    def counting_signature(function: Callable[..., object]) -> inspect.Signature:
        if getattr(function, "__name__", "") == "load_checkpoint":
            signatures.append(function)
        return signature(function)

    monkeypatch.setattr(checkpoints_module, "detect_checkpoint_format", counting_detect)
    monkeypatch.setattr(checkpoints_module.inspect, "signature", counting_signature)
    strategy = SingleDeviceStrategy("cpu")

    def no_way_back(*args: object, **kwargs: object) -> Checkpoint:
        raise AssertionError("Checkpoints called back into the strategy's read_checkpoint")

    monkeypatch.setattr(strategy, "read_checkpoint", no_way_back)
    module, optimizer = _adam_after_a_step()
    path = tmp_path / "a.ckpt"
    strategy.save_checkpoint({"model": module, "optimizer": optimizer, "step": 3}, path)
    for _ in range(2):
        left = strategy.load_checkpoint(path, {"model": module, "optimizer": optimizer})
        assert dict(left) == {"step": 3}
    assert detected == [str(path)] * 2
    assert len(signatures) == 1
    # An IO of the user's that takes no map_location: its signature looked up once too.
    io = JustSaveAndLoad()
    assert isinstance(io, CheckpointIO)  # at run time: its load takes no map_location
    other = SingleDeviceStrategy("cpu", checkpoint_io=io)
    other.save_checkpoint({"step": 4}, path)
    assert other.load_checkpoint(path) == {"step": 4}
    assert other.load_checkpoint(path) == {"step": 4}
    assert len(signatures) == 2
