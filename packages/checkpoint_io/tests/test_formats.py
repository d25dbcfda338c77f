"""The ``file`` and ``distributed`` formats: recognised by their files, read whole, consolidated."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from plait.checkpoint_io import (
    AsyncCheckpointIO,
    DistributedCheckpointIO,
    DistributedFormat,
    FileFormat,
    TorchCheckpointIO,
    XLACheckpointIO,
)
from plait.core import CheckpointError, SupportsFormat, detect_checkpoint_format


def _checkpoint() -> dict[str, object]:
    return {
        "state_dict": {"layer.weight": torch.arange(6.0).reshape(2, 3)},
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}],
        "step": 4,
    }


def test_each_io_says_the_format_it_writes() -> None:
    for io, expected in (
        (TorchCheckpointIO(), "file"),
        (XLACheckpointIO(), "file"),
        (DistributedCheckpointIO(), "distributed"),
        (AsyncCheckpointIO(), "file"),
    ):
        assert isinstance(io, SupportsFormat)
        assert io.format == expected
        io.teardown()


def test_a_torch_file_is_recognised_by_its_bytes_not_its_name(tmp_path: Path) -> None:
    TorchCheckpointIO().save_checkpoint(_checkpoint(), tmp_path / "saved.txt")
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    (tmp_path / "empty.ckpt").write_bytes(b"")

    assert FileFormat().recognizes(tmp_path / "saved.txt")
    assert not FileFormat().recognizes(tmp_path / "notes.ckpt")
    assert not FileFormat().recognizes(tmp_path / "empty.ckpt")
    assert not FileFormat().recognizes(tmp_path)
    assert not FileFormat().recognizes(tmp_path / "missing.ckpt")
    found = detect_checkpoint_format(tmp_path / "saved.txt")
    assert found is not None
    assert found.name == "file"


def test_a_file_at_an_fsspec_url_is_recognised_and_read_whole() -> None:
    url = "memory://formats/saved.ckpt"
    TorchCheckpointIO().save_checkpoint(_checkpoint(), url)

    assert FileFormat().recognizes(url)
    whole = FileFormat().read_whole(url, optimizers=False)

    assert whole["step"] == 4
    assert "optimizer_states" not in whole
    TorchCheckpointIO().remove_checkpoint(url)


def test_a_sharded_directory_is_recognised_once_complete(tmp_path: Path) -> None:
    DistributedCheckpointIO().save_checkpoint(_checkpoint(), tmp_path / "shards")

    assert DistributedFormat().recognizes(tmp_path / "shards")
    (tmp_path / "shards" / ".metadata").unlink()  # a save that did not finish
    assert not DistributedFormat().recognizes(tmp_path / "shards")
    assert detect_checkpoint_format(tmp_path / "shards") is None


@pytest.mark.parametrize("kind", ["file", "distributed"])
def test_each_format_reads_whole_and_consolidates_what_was_saved(tmp_path: Path, kind: str) -> None:
    io = TorchCheckpointIO() if kind == "file" else DistributedCheckpointIO()
    saved = tmp_path / "saved"
    io.save_checkpoint(_checkpoint(), saved)
    found = detect_checkpoint_format(saved)
    assert found is not None
    assert found.name == kind

    whole = found.read_whole(saved)
    found.consolidate(saved, tmp_path / "whole.pt")
    found.consolidate(saved, tmp_path / "weights.pt", weights_only=True)

    expected = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(whole["state_dict"]["layer.weight"], expected)
    assert whole["step"] == 4
    assert "optimizer_states" in whole
    consolidated = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert consolidated["step"] == 4
    assert torch.equal(consolidated["state_dict"]["layer.weight"], expected)
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert list(weights) == ["state_dict"]


@pytest.mark.parametrize("kind", ["file", "distributed"])
def test_a_checkpoint_without_module_state_is_not_consolidated_silently(
    tmp_path: Path, kind: str
) -> None:
    io = TorchCheckpointIO() if kind == "file" else DistributedCheckpointIO()
    io.save_checkpoint({"step": 1}, tmp_path / "saved")
    found = detect_checkpoint_format(tmp_path / "saved")
    assert found is not None

    with pytest.raises(CheckpointError, match=r"holds no module state \('state_dict'\)"):
        found.consolidate(tmp_path / "saved", tmp_path / "out.pt")

    assert not (tmp_path / "out.pt").exists()


def test_a_sharded_checkpoint_consolidates_with_the_keys_it_was_given(tmp_path: Path) -> None:
    saved = {
        **_checkpoint(),
        "extra": {"state": {0: {"momentum": torch.ones(2)}}, "empty": {}},
    }
    DistributedCheckpointIO().save_checkpoint(saved, tmp_path / "shards")

    DistributedFormat().consolidate(tmp_path / "shards", tmp_path / "whole.pt")

    extra = torch.load(tmp_path / "whole.pt", weights_only=True)["extra"]
    assert list(extra["state"]) == [0]  # not "0", nor plait's record of the keys
    assert torch.equal(extra["state"][0]["momentum"], torch.ones(2))
    assert extra["empty"] == {}
