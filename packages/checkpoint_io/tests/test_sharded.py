import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner

from plait.checkpoint_io import DistributedCheckpointIO
from plait.core import CheckpointError, SupportsCollectiveIO, SupportsLoadInPlace, checkpoint_dirs
from plait.core.checkpoint_dirs import MANIFEST, files_of, verify_manifest

HERE = Path(__file__).resolve().parent


def test_one_process_saves_and_loads_in_place(tmp_path: Path) -> None:
    io = DistributedCheckpointIO()
    weight = torch.randn(4, 3)
    io.save_checkpoint({"model": {"weight": weight}, "step": torch.tensor(7)}, tmp_path / "ckpt")
    restored_weight, restored_step = torch.zeros(4, 3), torch.tensor(0)

    io.load_checkpoint_into(
        tmp_path / "ckpt", {"model": {"weight": restored_weight}, "step": restored_step}
    )

    assert torch.equal(restored_weight, weight)
    assert torch.equal(restored_step, torch.tensor(7))
    assert isinstance(io, SupportsLoadInPlace)


def test_loading_in_place_returns_the_other_entries_read_whole(tmp_path: Path) -> None:
    io = DistributedCheckpointIO()
    weight = torch.randn(4, 3)
    saved = {
        "state_dict": {"layer.weight": weight},
        "loops": {"epoch": 2, "seed": 7},
        "rng_states": [{"torch": torch.arange(3)}],
    }
    io.save_checkpoint(saved, tmp_path / "ckpt")
    target = torch.zeros(4, 3)

    loaded = io.load_checkpoint_into(tmp_path / "ckpt", {"state_dict": {"layer.weight": target}})

    assert torch.equal(target, weight)
    assert loaded["state_dict"]["layer.weight"] is target
    assert loaded["loops"] == {"epoch": 2, "seed": 7}
    assert torch.equal(loaded["rng_states"][0]["torch"], torch.arange(3))
    assert isinstance(io, SupportsCollectiveIO)
    assert io.collective


def test_a_full_copy_can_be_read_without_a_template(tmp_path: Path) -> None:
    io = DistributedCheckpointIO()
    weight = torch.randn(4, 3)
    io.save_checkpoint({"model": {"weight": weight}, "epoch": 3}, tmp_path / "ckpt")

    loaded = io.load_checkpoint(tmp_path / "ckpt")

    assert torch.equal(loaded["model"]["weight"], weight)
    assert loaded["epoch"] == 3


def test_a_new_save_replaces_the_previous_directory(tmp_path: Path) -> None:
    io = DistributedCheckpointIO()
    io.save_checkpoint({"step": torch.tensor(1)}, tmp_path / "ckpt")
    io.save_checkpoint({"step": torch.tensor(2)}, tmp_path / "ckpt")

    assert io.load_checkpoint(tmp_path / "ckpt")["step"] == torch.tensor(2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_an_incomplete_checkpoint_is_refused(tmp_path: Path) -> None:
    io = DistributedCheckpointIO()
    io.save_checkpoint({"step": torch.tensor(1)}, tmp_path / "ckpt")
    (tmp_path / "ckpt" / ".metadata").unlink()

    with pytest.raises(CheckpointError, match=r"is incomplete: it has no \.metadata"):
        io.load_checkpoint_into(tmp_path / "ckpt", {"step": torch.tensor(0)})


def test_missing_checkpoints_and_keys_are_named(tmp_path: Path) -> None:
    io = DistributedCheckpointIO()
    with pytest.raises(CheckpointError, match="does not exist"):
        io.load_checkpoint(tmp_path / "nope")
    io.save_checkpoint({"a": torch.ones(1)}, tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="cannot be loaded into the given state"):
        io.load_checkpoint_into(tmp_path / "ckpt", {"b": torch.zeros(1)})


def test_remove_deletes_the_directory(tmp_path: Path) -> None:
    io = DistributedCheckpointIO()
    io.save_checkpoint({"a": torch.ones(1)}, tmp_path / "ckpt")

    io.remove_checkpoint(tmp_path / "ckpt")

    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(CheckpointError, match="does not exist"):
        io.remove_checkpoint(tmp_path / "ckpt")


def _saved(tmp_path: Path) -> tuple[DistributedCheckpointIO, Path]:
    io = DistributedCheckpointIO()
    path = tmp_path / "epoch=1.ckpt"
    io.save_checkpoint({"weight": torch.arange(64.0), "step": 3}, path)
    return io, path


def test_every_file_of_a_sharded_checkpoint_has_its_size_and_checksum_kept(
    tmp_path: Path,
) -> None:
    _, path = _saved(tmp_path)

    manifest = json.loads((path / MANIFEST).read_text())["files"]

    assert set(manifest) == set(files_of(path))
    assert ".metadata" in manifest
    assert all(entry["size"] > 0 for entry in manifest.values())


@pytest.mark.parametrize("damage", ["flipped", "truncated", "missing"])
@pytest.mark.parametrize("which", ["shard", ".metadata"])
def test_a_damaged_file_is_refused_naming_it_by_every_reader(
    tmp_path: Path, damage: str, which: str
) -> None:
    io, path = _saved(tmp_path)
    name = (
        ".metadata"
        if which == ".metadata"
        else next(name for name in files_of(path) if name.endswith(".distcp"))
    )
    file = path / name
    data = bytearray(file.read_bytes())
    if damage == "flipped":
        data[len(data) // 2] ^= 0x01
        file.write_bytes(bytes(data))
    elif damage == "truncated":
        file.write_bytes(bytes(data[:-1]))
    else:
        file.unlink()
    said = {"flipped": "does not match its CRC-32", "truncated": "truncated", "missing": "missing"}
    expected = rf"is damaged: {re.escape(name)} .*{said[damage]}"
    if which == ".metadata" and damage == "missing":
        expected = r"is incomplete: it has no \.metadata"  # refused before the checksums

    with pytest.raises(CheckpointError, match=expected):
        io.load_checkpoint_into(path, {"weight": torch.zeros(64), "step": 0})
    with pytest.raises(CheckpointError, match=expected):
        io.load_checkpoint(path)


def test_a_checkpoint_without_checksums_from_another_program_still_loads(
    tmp_path: Path,
) -> None:
    io, path = _saved(tmp_path)
    (path / MANIFEST).unlink()

    assert io.load_checkpoint(path)["step"] == 3


def test_what_interrupted_saves_left_is_cleaned_and_a_replaced_checkpoint_put_back(
    tmp_path: Path,
) -> None:
    io, path = _saved(tmp_path)
    # Killed while writing: a partial directory. Killed between the two renames of
    # a save replacing last.ckpt: the complete previous one, aside.
    (tmp_path / "epoch=2.ckpt.partial").mkdir()
    (tmp_path / "epoch=2.ckpt.partial" / "__0_0.distcp").write_bytes(b"half")
    path.rename(tmp_path / "last.ckpt.previous")
    _, kept = _saved(tmp_path / "other")
    (tmp_path / "other" / "epoch=1.ckpt.previous").mkdir()

    with pytest.warns(UserWarning, match=r"put .*last\.ckpt back from last\.ckpt\.previous"):
        removed = io.remove_partial(tmp_path)

    assert removed == [str(tmp_path / "epoch=2.ckpt.partial")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "other"]
    assert io.load_checkpoint(tmp_path / "last.ckpt")["step"] == 3
    assert io.remove_partial(tmp_path / "other") == [
        str(tmp_path / "other" / "epoch=1.ckpt.previous")
    ]
    assert io.load_checkpoint(kept)["step"] == 3


def test_a_save_over_a_checkpoint_replaces_it_whole_in_one_step(tmp_path: Path) -> None:
    io, path = _saved(tmp_path)
    before = {p.name for p in tmp_path.iterdir()}

    io.save_checkpoint({"weight": torch.ones(64), "step": 4}, path)

    assert {p.name for p in tmp_path.iterdir()} == before
    assert io.load_checkpoint(path)["step"] == 4
    assert verify_manifest(path) == []


@pytest.mark.slow
def test_two_gloo_ranks_save_and_load_in_place(tmp_path: Path) -> None:
    world_size = 2
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "dcp_rank.py"),
                str(rank),
                str(world_size),
                str(tmp_path / "store"),
                str(tmp_path / "ckpt"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank in range(world_size)
    ]
    try:
        outputs = [process.communicate(timeout=90)[0] for process in ranks]
    finally:
        for process in ranks:
            process.kill()
            process.wait(timeout=30)
            if process.stdout is not None:
                process.stdout.close()

    assert [process.returncode for process in ranks] == [0, 0], "\n".join(outputs)
    full = DistributedCheckpointIO().load_checkpoint(tmp_path / "ckpt")
    assert set(full) == {"shared", "rank0", "rank1"}
    assert torch.equal(full["rank1"], torch.full((3,), 1.0))


def test_planners_given_are_made_afresh_for_each_save_and_load(tmp_path: Path) -> None:
    made: list[str] = []

    class CountingSavePlanner(DefaultSavePlanner):
        def __init__(self) -> None:
            made.append("save")
            super().__init__()

    class CountingLoadPlanner(DefaultLoadPlanner):
        def __init__(self) -> None:
            made.append("load")
            super().__init__()

    io = DistributedCheckpointIO(save_planner=CountingSavePlanner, load_planner=CountingLoadPlanner)
    weight = torch.randn(5)
    io.save_checkpoint({"state_dict": {"w": weight}}, tmp_path / "a")
    io.save_checkpoint({"state_dict": {"w": weight * 2}}, tmp_path / "b")
    target = torch.zeros(5)
    io.load_checkpoint_into(tmp_path / "b", {"state_dict": {"w": target}})

    assert made == ["save", "save", "load"]
    assert torch.equal(target, weight * 2)
    assert repr(io) == (
        "DistributedCheckpointIO(save_planner=CountingSavePlanner, "
        "load_planner=CountingLoadPlanner)"
    )
    assert repr(DistributedCheckpointIO()) == "DistributedCheckpointIO()"


def test_where_directories_cannot_be_exchanged_the_old_one_is_set_aside_then_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_dirs, "_renameat2", lambda: None)
    io, path = _saved(tmp_path)

    io.save_checkpoint({"weight": torch.ones(64), "step": 5}, path)

    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    assert io.load_checkpoint(path)["step"] == 5
