import datetime
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from plait.checkpoint_io import TorchCheckpointIO
from plait.core import CheckpointError, CheckpointIO, CheckpointIORegistry

HERE = Path(__file__).resolve().parent
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool]


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    shape = draw(st.lists(st.integers(0, 4), max_size=3), label="shape")
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31), label="seed"))
    dtype = draw(st.sampled_from(DTYPES), label="dtype")
    return (torch.randn(shape, generator=generator) * 100).to(dtype)


leaves = (
    tensors()
    | st.integers(-(2**62), 2**62)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.booleans()
    | st.none()
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
checkpoints = st.dictionaries(st.text(min_size=1, max_size=8), values, max_size=5)


def same(left: object, right: object) -> bool:
    if isinstance(left, torch.Tensor):
        return (
            isinstance(right, torch.Tensor)
            and left.dtype == right.dtype
            and torch.equal(left, right)
        )
    if isinstance(left, dict):
        return (
            isinstance(right, dict)
            and left.keys() == right.keys()
            and all(same(left[k], right[k]) for k in left)
        )
    if isinstance(left, list | tuple):
        return type(left) is type(right) and len(left) == len(right) and all(map(same, left, right))
    return type(left) is type(right) and left == right


@given(checkpoint=checkpoints)
def test_checkpoints_round_trip_on_local_disk(
    checkpoint: dict[str, object], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("ckpt") / "nested" / "last.pt"
    io = TorchCheckpointIO()

    io.save_checkpoint(checkpoint, path)

    assert same(io.load_checkpoint(path), checkpoint)
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary left


@given(checkpoint=checkpoints)
def test_checkpoints_round_trip_through_fsspec_urls(checkpoint: dict[str, object]) -> None:
    url = f"memory://plait-tests/{uuid.uuid4().hex}/last.pt"
    io = TorchCheckpointIO()

    io.save_checkpoint(checkpoint, url)

    assert same(io.load_checkpoint(url), checkpoint)
    io.remove_checkpoint(url)
    with pytest.raises(CheckpointError, match="does not exist"):
        io.load_checkpoint(url)


def test_a_new_save_replaces_the_previous_whole(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "last.pt"
    io.save_checkpoint({"step": 1}, path)
    io.save_checkpoint({"step": 2}, path)

    assert io.load_checkpoint(path) == {"step": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_a_save_that_cannot_be_serialised_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "last.pt"
    io.save_checkpoint({"step": 1}, path)

    with pytest.raises(CheckpointError, match="cannot be written") as caught:
        io.save_checkpoint({"step": 2, "callback": lambda: None}, path)

    assert caught.value.path == str(path)
    assert io.load_checkpoint(path) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


@pytest.mark.slow
def test_a_process_killed_mid_save_leaves_the_previous_checkpoint_intact(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "last.pt"
    io.save_checkpoint({"weights": torch.ones(256, 256), "step": 1}, path)
    child = subprocess.Popen(
        [sys.executable, str(HERE / "save_and_block.py"), str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "blocked"  # the save is under way
        temporaries = [p for p in tmp_path.iterdir() if p.name.startswith(".last.pt.")]
        assert len(temporaries) == 1
    finally:
        child.kill()  # SIGKILL: no handler, no cleanup
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()

    assert child.returncode == -9
    restored = io.load_checkpoint(path)
    assert restored["step"] == 1
    assert torch.equal(restored["weights"], torch.ones(256, 256))


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist") as caught:
        TorchCheckpointIO().load_checkpoint(tmp_path / "nope.pt")

    assert caught.value.path == str(tmp_path / "nope.pt")


def test_a_directory_is_not_a_checkpoint_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is a directory, not a checkpoint file"):
        TorchCheckpointIO().load_checkpoint(tmp_path)


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.0])
def test_a_truncated_file_is_a_checkpoint_error(tmp_path: Path, keep: float) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "last.pt"
    io.save_checkpoint({"weights": torch.randn(64, 64)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])

    with pytest.raises(CheckpointError, match="is truncated or not a torch checkpoint"):
        io.load_checkpoint(path)


def test_a_foreign_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a checkpoint\n")

    with pytest.raises(CheckpointError, match="is truncated or not a torch checkpoint"):
        TorchCheckpointIO().load_checkpoint(path)


def test_a_file_that_is_not_a_dictionary_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "list.pt"
    torch.save([1, 2, 3], path)

    with pytest.raises(CheckpointError, match="holds a list, not a checkpoint dictionary"):
        TorchCheckpointIO().load_checkpoint(path)


def test_pickled_objects_are_refused_unless_asked_for_and_the_fix_warns(tmp_path: Path) -> None:
    path = tmp_path / "dated.pt"
    TorchCheckpointIO().save_checkpoint({"when": datetime.date(2026, 1, 1)}, path)

    with pytest.raises(CheckpointError, match="refuses to unpickle") as caught:
        TorchCheckpointIO().load_checkpoint(path)

    assert caught.value.fix is not None
    assert "weights_only=False" in caught.value.fix
    assert "arbitrary code" in caught.value.fix
    assert TorchCheckpointIO(weights_only=False).load_checkpoint(path) == {
        "when": datetime.date(2026, 1, 1)
    }


def test_removing_a_missing_checkpoint_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot be removed: it does not exist"):
        TorchCheckpointIO().remove_checkpoint(tmp_path / "nope.pt")


def test_the_built_in_ios_are_registered() -> None:
    assert set(CheckpointIORegistry.available()) == {"torch", "async", "distributed", "xla"}
    for name in ("torch", "async", "distributed", "xla"):
        built = CheckpointIORegistry.get(name)
        assert isinstance(built, CheckpointIO)
        built.teardown()


def test_the_refusal_names_what_was_blocked(tmp_path: Path) -> None:
    path = tmp_path / "dated.pt"
    TorchCheckpointIO().save_checkpoint({"when": datetime.date(2026, 1, 1)}, path)

    with pytest.raises(CheckpointError, match=r"Unsupported global: GLOBAL datetime\.date"):
        TorchCheckpointIO().load_checkpoint(path)


def test_a_changed_byte_fails_the_checksum(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    TorchCheckpointIO().save_checkpoint({"w": torch.arange(4096, dtype=torch.float32)}, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    with pytest.raises(CheckpointError, match="is corrupt: the checksum of its record"):
        TorchCheckpointIO().load_checkpoint(path)


def test_a_copy_is_a_link_renamed_into_place_and_outlives_its_source(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    source, target = tmp_path / "epoch.ckpt", tmp_path / "sub" / "last.ckpt"
    io.save_checkpoint({"step": 1}, source)
    io.save_checkpoint({"step": 0}, target)

    io.copy_checkpoint(source, target)

    assert source.stat().st_ino == target.stat().st_ino
    io.remove_checkpoint(source)
    assert io.load_checkpoint(target) == {"step": 1}
    io.save_checkpoint({"step": 2}, target)  # a later save replaces the link whole
    assert io.load_checkpoint(target) == {"step": 2}
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]


def test_copying_a_missing_checkpoint_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot be copied: it does not exist"):
        TorchCheckpointIO().copy_checkpoint(tmp_path / "nope.ckpt", tmp_path / "last.ckpt")


def test_copies_work_across_fsspec_urls() -> None:
    io = TorchCheckpointIO()
    base = f"memory://plait-{uuid.uuid4().hex}"
    io.save_checkpoint({"step": 3}, f"{base}/epoch.ckpt")

    io.copy_checkpoint(f"{base}/epoch.ckpt", f"{base}/last.ckpt")

    assert io.load_checkpoint(f"{base}/last.ckpt") == {"step": 3}


def test_partial_saves_are_removed_and_nothing_else(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    io.save_checkpoint({"step": 1}, tmp_path / "last.ckpt")
    (tmp_path / ".last.ckpt.k2j_9x.tmp").write_bytes(b"partial")
    (tmp_path / "notes.tmp").write_text("the user's")

    removed = io.remove_partial(tmp_path)

    assert removed == [str(tmp_path / ".last.ckpt.k2j_9x.tmp")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "notes.tmp"]
    assert io.remove_partial(tmp_path / "absent") == []
