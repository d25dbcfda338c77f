import threading
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from typing_extensions import override

from plait.checkpoint_io import AsyncCheckpointIO, TorchCheckpointIO, snapshot
from plait.checkpoint_io.async_io import StagingBuffers
from plait.core import CheckpointError, SupportsAsyncCheckpoint
from plait.core.typing import PathLike


class GatedIO(TorchCheckpointIO):
    """Saves only once the test opens the gate, so the test controls the timing."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    @override
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        super().save_checkpoint(checkpoint, path)


class FailingIO(GatedIO):
    """Fails every save, once the test opens the gate."""

    @override
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        raise OSError(28, "No space left on device")


def test_in_place_updates_after_save_do_not_reach_the_file(tmp_path: Path) -> None:
    inner = GatedIO()
    io = AsyncCheckpointIO(inner)
    weights = torch.zeros(4)
    nested = {"model": {"weights": weights}, "history": [1, 2]}

    io.save_checkpoint(nested, tmp_path / "last.pt")
    weights.add_(1.0)  # training goes on while the save waits
    nested["history"].append(3)  # type: ignore[attr-defined]
    inner.gate.set()
    io.wait()

    restored = io.load_checkpoint(tmp_path / "last.pt")
    assert torch.equal(restored["model"]["weights"], torch.zeros(4))
    assert restored["history"] == [1, 2]
    io.teardown()


def test_saves_run_in_order_and_load_sees_the_last(tmp_path: Path) -> None:
    io = AsyncCheckpointIO()
    for step in range(5):
        io.save_checkpoint({"step": step}, tmp_path / "last.pt")

    assert io.load_checkpoint(tmp_path / "last.pt") == {"step": 4}
    io.teardown()


def test_it_saves_again_after_teardown_as_a_trainer_run_after_another_needs(
    tmp_path: Path,
) -> None:
    io = AsyncCheckpointIO()
    io.save_checkpoint({"step": 1}, tmp_path / "a.pt")
    io.teardown()
    io.teardown()  # twice, as a strategy torn down again: nothing left to finish

    io.save_checkpoint({"step": 2}, tmp_path / "b.pt")
    assert io.load_checkpoint(tmp_path / "a.pt") == {"step": 1}
    assert io.load_checkpoint(tmp_path / "b.pt") == {"step": 2}
    io.teardown()
    assert not [t for t in threading.enumerate() if t.name.startswith("plait-checkpoint")]


def test_a_failed_background_save_surfaces_on_the_next_call(tmp_path: Path) -> None:
    inner = FailingIO()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({"step": 1}, tmp_path / "a.pt")
    inner.gate.set()

    with pytest.raises(CheckpointError, match="No space left on device") as caught:
        io.wait()
    assert caught.value.path == str(tmp_path / "a.pt")
    io.wait()  # reported once, not forever
    io.teardown()


def test_a_failed_background_save_surfaces_at_teardown(tmp_path: Path) -> None:
    inner = FailingIO()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({"step": 1}, tmp_path / "a.pt")
    io.save_checkpoint({"step": 2}, tmp_path / "b.pt")
    inner.gate.set()

    with pytest.raises(CheckpointError, match=r"and 1 later save\(s\) failed too: .*b\.pt"):
        io.teardown()


def test_a_load_after_a_failed_save_raises_the_failure(tmp_path: Path) -> None:
    inner = FailingIO()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({"step": 1}, tmp_path / "a.pt")
    inner.gate.set()

    with pytest.raises(CheckpointError, match="No space left on device"):
        io.load_checkpoint(tmp_path / "a.pt")
    io.teardown()


def test_it_offers_waiting_as_a_capability() -> None:
    io = AsyncCheckpointIO()

    assert isinstance(io, SupportsAsyncCheckpoint)
    io.teardown()


def test_a_snapshot_copies_containers_and_tensors() -> None:
    tensor = torch.ones(2, requires_grad=True)
    original = {"a": [tensor, (tensor, {"x": 1})], "b": {"c"}}

    copied = snapshot(original)

    assert isinstance(copied, dict)
    assert copied["a"][0] is not tensor
    assert not copied["a"][0].requires_grad
    assert copied["b"] == {"c"}
    assert copied["b"] is not original["b"]


def test_kept_buffers_are_copied_into_only_once_their_save_is_written(tmp_path: Path) -> None:
    inner = GatedIO()
    io = AsyncCheckpointIO(inner, keep_buffers=True)
    weights = torch.zeros(4)

    io.save_checkpoint({"weights": weights}, tmp_path / "first.pt")
    weights.add_(1.0)
    io.save_checkpoint({"weights": weights}, tmp_path / "second.pt")  # the first still waits
    weights.add_(1.0)
    inner.gate.set()
    io.wait()
    io.save_checkpoint({"weights": weights}, tmp_path / "third.pt")  # into kept buffers
    weights.add_(1.0)
    io.wait()
    io.save_checkpoint({"weights": weights, "more": torch.ones(2, 2)}, tmp_path / "fourth.pt")
    io.wait()

    for name, value in (("first", 0.0), ("second", 1.0), ("third", 2.0), ("fourth", 3.0)):
        restored = io.load_checkpoint(tmp_path / f"{name}.pt")
        assert torch.equal(restored["weights"], torch.full((4,), value)), name
    assert torch.equal(io.load_checkpoint(tmp_path / "fourth.pt")["more"], torch.ones(2, 2))
    assert "keep_buffers=True" in repr(io)
    io.teardown()


def test_a_snapshot_into_kept_buffers_reuses_those_that_fit() -> None:
    buffers = StagingBuffers()
    first = snapshot({"a": torch.zeros(3), "b": torch.zeros(2)}, buffers)
    buffers.start()
    second = snapshot({"a": torch.ones(3), "b": torch.ones(5)}, buffers)

    assert isinstance(first, dict)
    assert isinstance(second, dict)
    assert second["a"] is first["a"]  # the same shape: copied into
    assert second["b"] is not first["b"]  # another shape: made anew
    assert torch.equal(second["a"], torch.ones(3))
    assert buffers.nbytes == 4 * (3 + 5)
