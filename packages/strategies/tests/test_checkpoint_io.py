from collections.abc import Mapping
from pathlib import Path

import pytest
from typing_extensions import override

from plait.core import CheckpointError, CheckpointIO
from plait.core.typing import Checkpoint, PathLike
from plait.strategies import CheckpointIO as CheckpointIOBase
from plait.strategies import SingleDeviceStrategy


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
