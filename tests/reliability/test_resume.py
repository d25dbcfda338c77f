"""Resuming, and checkpoints that survive what happens to them (a killed save, a flipped bit)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from tests.reliability.jobs import Job, fit_command, run, wait_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("strategy", "devices"), [("single_device", 1), ("ddp", 2), ("ddp_spawn", 2)]
)
def test_resume_from_last_then_keep_training_and_checkpointing_within_120s(
    tmp_path: Path, strategy: str, devices: int
) -> None:
    first = run(fit_command(strategy, devices, tmp_path, "max_epochs=2"), tmp_path)
    assert first.returncode == 0, first.stderr
    steps_per_epoch = 16 // devices

    resumed = run(
        fit_command(strategy, devices, tmp_path, "max_epochs=4", "ckpt_path='last'"), tmp_path
    )
    again = run(
        fit_command(strategy, devices, tmp_path, "max_epochs=5", "ckpt_path='last'"), tmp_path
    )

    assert resumed.returncode == 0, resumed.stderr
    assert again.returncode == 0, again.stderr
    assert again.result() == {"global_step": 5 * steps_per_epoch, "epoch": 5}
    # The newest epoch's checkpoint and last.ckpt only: nothing leaked, nothing missing.
    assert again.checkpoints() == [f"epoch=4-step={5 * steps_per_epoch}.ckpt", "last.ckpt"]


def test_resume_from_an_early_epoch_checkpoint_leaks_no_file_within_60s(tmp_path: Path) -> None:
    first = run(fit_command("single_device", 1, tmp_path, "max_epochs=1"), tmp_path)
    assert first.checkpoints() == ["epoch=0-step=16.ckpt", "last.ckpt"]
    early = str(tmp_path / "checkpoints" / "epoch=0-step=16.ckpt")

    resumed = run(
        fit_command("single_device", 1, tmp_path, "max_epochs=3", f"ckpt_path={early!r}"),
        tmp_path,
    )

    assert resumed.returncode == 0, resumed.stderr
    assert resumed.checkpoints() == ["epoch=2-step=48.ckpt", "last.ckpt"]


def test_each_epoch_is_serialised_once_and_last_shares_its_file(tmp_path: Path) -> None:
    done = run(fit_command("single_device", 1, tmp_path, "max_epochs=1"), tmp_path)

    assert done.returncode == 0, done.stderr
    folder = tmp_path / "checkpoints"
    epoch, last = (folder / "epoch=0-step=16.ckpt").stat(), (folder / "last.ckpt").stat()
    assert (epoch.st_ino, epoch.st_dev) == (last.st_ino, last.st_dev)


def test_save_outlasting_the_collective_timeout_completes_under_ddp_within_120s(
    tmp_path: Path,
) -> None:
    # Each save takes 8 s; the collective timeout is 5 s (not less: a rank merely slow
    # to set up on a loaded machine would be taken for a hung one). Saves have their
    # own bound.
    done = run(
        fit_command("ddp", 2, tmp_path, "max_epochs=1"),
        tmp_path,
        {"TIMEOUT": "5", "SLOW_SAVE": "8"},
    )

    assert done.returncode == 0, done.stderr
    assert done.checkpoints() == ["epoch=0-step=8.ckpt", "last.ckpt"]


def test_a_save_killed_midway_keeps_the_previous_checkpoint_and_its_temp_file_is_cleaned(
    tmp_path: Path,
) -> None:
    big = {"WIDTH": "1000000"}  # a 40 MB checkpoint: its save takes a while
    run(fit_command("single_device", 1, tmp_path, "max_epochs=1"), tmp_path, big)
    before = (tmp_path / "checkpoints" / "last.ckpt").read_bytes()
    folder = tmp_path / "checkpoints"
    job = Job(
        fit_command("single_device", 1, tmp_path, "max_epochs=2", "ckpt_path='last'"),
        tmp_path,
        big,
    )
    wait_for(
        lambda: (
            any(p.name.endswith(".tmp") for p in folder.iterdir()) or job.process.poll() is not None
        ),
        90,
        "the next save to start writing",
    )
    job.signal(signal.SIGKILL)
    job.finish()
    if any(p.name.endswith(".tmp") for p in folder.iterdir()):  # killed while writing
        assert (folder / "last.ckpt").read_bytes() == before
    else:  # the save had finished: leave a partial file as such a kill would have
        (folder / ".last.ckpt.abc_123.tmp").write_bytes(b"partial")

    resumed = run(
        fit_command("single_device", 1, tmp_path, "max_epochs=2", "ckpt_path='last'"),
        tmp_path,
        big,
    )

    assert resumed.returncode == 0, resumed.stderr
    assert not [name for name in resumed.checkpoints() if name.endswith(".tmp")]
    assert "left by a save that was interrupted" in resumed.stderr


def test_last_falls_back_to_the_newest_complete_checkpoint_within_60s(tmp_path: Path) -> None:
    run(fit_command("single_device", 1, tmp_path, "max_epochs=1"), tmp_path)
    os.remove(tmp_path / "checkpoints" / "last.ckpt")  # as if its save never finished

    resumed = run(
        fit_command("single_device", 1, tmp_path, "max_epochs=2", "ckpt_path='last'"),
        tmp_path,
    )

    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from the newest complete checkpoint" in resumed.stderr
    assert list(resumed.seen()["losses"]) == [str(step) for step in range(32)]  # type: ignore[call-overload]


def test_a_flipped_bit_is_refused_not_loaded(tmp_path: Path) -> None:
    run(fit_command("single_device", 1, tmp_path, "max_epochs=1"), tmp_path)
    path = tmp_path / "checkpoints" / "epoch=0-step=16.ckpt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    damaged = tmp_path / "damaged.ckpt"
    damaged.write_bytes(bytes(data))

    resumed = run(
        fit_command("single_device", 1, tmp_path, "max_epochs=2", f"ckpt_path={str(damaged)!r}"),
        tmp_path,
    )

    assert resumed.returncode == 1
    assert "is corrupt: the checksum of its record" in resumed.stderr


def test_a_checkpoint_of_another_shape_names_the_parameter_and_both_shapes(
    tmp_path: Path,
) -> None:
    run(fit_command("single_device", 1, tmp_path, "max_epochs=1"), tmp_path)

    resumed = run(
        fit_command("single_device", 1, tmp_path, "max_epochs=2", "ckpt_path='last'"),
        tmp_path,
        {"WIDTH": "32"},
    )

    assert resumed.returncode == 1
    assert (
        "'net.0.weight' has shape (16, 8) in the checkpoint and (32, 8) in the model"
        in resumed.stderr
    )


def test_a_directory_given_as_checkpoint_is_called_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "somewhere"
    folder.mkdir()

    done = run(fit_command("single_device", 1, tmp_path, f"ckpt_path={str(folder)!r}"), tmp_path)

    assert done.returncode == 1
    assert "is a directory that no strategy wrote" in done.stderr


def test_ddp_with_the_distributed_checkpoint_io_trains_saves_and_resumes_exactly_within_180s(
    tmp_path: Path,
) -> None:
    # Every rank writes its part of each checkpoint (a directory), and reads its state
    # back in place; the run then goes on as if it had never stopped.
    collective = "plugins=['distributed']"
    straight_root, resumed_root = tmp_path / "straight", tmp_path / "resumed"
    straight_root.mkdir()
    resumed_root.mkdir()
    straight = run(fit_command("ddp", 2, straight_root, "max_epochs=3", collective), straight_root)
    first = run(fit_command("ddp", 2, resumed_root, "max_epochs=2", collective), resumed_root)
    resumed = run(
        fit_command("ddp", 2, resumed_root, "max_epochs=3", collective, "ckpt_path='last'"),
        resumed_root,
    )

    for job in (straight, first, resumed):
        assert job.returncode == 0, job.stderr
    # 'last' is a directory: it is resumed from, not passed over for a fresh start
    # (which would give the same losses, as each rank records them by step).
    assert "does not exist" not in resumed.stderr, resumed.stderr
    assert "starts afresh" not in resumed.stderr, resumed.stderr
    assert resumed.checkpoints() == ["epoch=2-step=24.ckpt", "last.ckpt"]
    assert (resumed_root / "checkpoints" / "last.ckpt" / ".metadata").is_file()
    for rank in (0, 1):
        assert resumed.seen(rank)["losses"] == straight.seen(rank)["losses"]
