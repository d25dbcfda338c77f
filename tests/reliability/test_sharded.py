"""The reliability table for the sharded strategies, where a checkpoint is many files.

Every job trains ``fit_script.py`` for 3 epochs of 8 steps with a checkpoint every epoch
(a directory each rank writes its part of), started as users start it (``ddp``'s
launcher runs the script for each rank; rank 0 is the launcher), bounded in time and
checked for processes left behind. Each strategy's uninterrupted run is the reference.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from tests.reliability.jobs import LONG_JOB_TIMEOUT, Finished, fit_command, run

from plait.core.checkpoint_dirs import PARTIAL_SUFFIX, verify_manifest

JOB_TIMEOUT = LONG_JOB_TIMEOUT
"""Each job's bound: a run of 3 epochs on 2 or 4 ranks."""

# pytest's own bound (120 s) is for a test in one process. Each job here is bounded by
# JOB_TIMEOUT, and a test's bound is its jobs' (the strategy's reference run, if it
# is the first of its worker, and its own) and a minute more: a job that runs long is
# stopped by its own bound and reported with its output, and none is left running.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * JOB_TIMEOUT + 60)]


def _on(name: str) -> pytest.MarkDecorator:
    """Each strategy's tests on one worker, which runs its reference once."""
    return pytest.mark.xdist_group(f"reliability_sharded_{name}")


STRATEGIES = {
    "fsdp": (2, {}),
    "deepspeed_stage_3": (2, {}),
    "model_parallel": (4, {"data_parallel_size": 2, "tensor_parallel_size": 2}),
}
"""Each strategy: its ranks and options (model_parallel on a 2x2 mesh)."""

_references: dict[str, Finished] = {}
_seen: dict[int, dict[str, object]] = {}
"""What rank 0 of each job saw (by the job's ``id``), kept before the next job in its root."""


def _job(name: str, root: Path, *settings: str, **env: str) -> Finished:
    ranks, options = STRATEGIES[name]
    root.mkdir(parents=True, exist_ok=True)
    done = run(
        fit_command(name, ranks, root, "max_epochs=3", *settings),
        root,
        {"STRATEGY_OPTIONS": json.dumps(options), **env},
        timeout=JOB_TIMEOUT,
    )
    _seen[id(done)] = done.seen()
    for path in root.glob("seen-*.json"):  # the next run in this root writes its own
        path.unlink()
    return done


def _reference(name: str, tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """The strategy's uninterrupted run (once per module and strategy)."""
    if name not in _references:
        done = _job(name, tmp_path_factory.mktemp(f"{name}-whole"), KEEP_EVERY_EPOCH="1")
        assert done.returncode == 0, done.stderr[-3000:]
        _references[name] = done
    return _references[name]


def _losses(*runs: Finished) -> dict[str, float]:
    """Rank 0's loss at every step the runs took, the later run's where both took one."""
    merged: dict[str, float] = {}
    for done in runs:
        merged.update(_seen[id(done)].get("losses", {}))  # type: ignore[call-overload]
    return merged


def _complete_under_final_names(folder: Path) -> list[str]:
    """The checkpoints in ``folder``, each checked whole: every name ends in .ckpt and
    holds a complete checkpoint whose files match their checksums."""
    names = []
    for entry in sorted(folder.iterdir()):
        if entry.name.endswith(PARTIAL_SUFFIX):
            continue  # what the killed save left; removed at the next start
        assert entry.name.endswith(".ckpt"), entry.name
        assert (entry / ".metadata").is_file() or (entry / "latest").is_file(), entry
        assert verify_manifest(entry) == [], entry
        names.append(entry.name)
    return names


def _stop_step(stopped: Finished) -> int:
    found = re.search(r"training stopped on SIGTERM at step (\d+)", stopped.stderr)
    assert found is not None, stopped.stderr[-3000:]
    return int(found.group(1))


@pytest.mark.timeout(4 * JOB_TIMEOUT + 60)  # the reference and three jobs
@pytest.mark.parametrize(
    ("name", "killed"),
    [
        pytest.param("fsdp", "1:epoch", id="fsdp-rank 1 in an epoch's save", marks=_on("fsdp")),
        pytest.param("deepspeed_stage_3", "0:last", marks=_on("deepspeed_stage_3"),
                     id="deepspeed_stage_3-the launcher in last's save"),
        pytest.param("model_parallel", "1:last", marks=_on("model_parallel"),
                     id="model_parallel-rank 1 in last's save"),
    ],
)  # fmt: skip
def test_a_stop_then_a_kill_mid_save_then_last_ends_as_the_uninterrupted_run(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, name: str, killed: str
) -> None:
    whole = _reference(name, tmp_path_factory)
    # SIGTERM early in the first epoch: every rank stops at one batch and saves
    # last.ckpt. The ranks agree on stopping every few batches (as many as take about
    # 50 ms): a signal late in the run could find it ended first.
    stopped = _job(name, tmp_path, SIGNAL_STEP="3")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    step = _stop_step(stopped)
    end_of_epoch = step if step % 8 == 0 else (step // 8 + 1) * 8

    # Resumed, then killed in the middle of a save: of the epoch's checkpoint (last.ckpt,
    # the stop's, is then the newest complete one), or of last.ckpt after the epoch's
    # (that one is then the newest, under another name).
    rank, kind = killed.split(":")
    interrupted = _job(name, tmp_path, "ckpt_path='last'", KILL_IN_SAVE=killed)
    assert interrupted.returncode not in (0, 143), interrupted.stderr[-3000:]
    assert f"rank {rank} kills itself in a save of {kind}" in interrupted.stderr
    if rank == "1":  # the launcher names the rank that died
        assert "rank 1 failed (exit code -9, killed by SIGKILL)" in interrupted.stderr
    folder = tmp_path / "checkpoints"
    saved = _complete_under_final_names(folder)
    assert [p for p in folder.iterdir() if p.name.endswith(PARTIAL_SUFFIX)], "no save was cut"
    assert "last.ckpt" in saved
    if kind == "last":
        assert f"epoch={end_of_epoch // 8 - 1}-step={end_of_epoch}.ckpt" in saved

    # "last" is the newest complete checkpoint, whichever file holds it.
    resumed = _job(name, tmp_path, "ckpt_path='last'")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "left by a save that was interrupted" in resumed.stderr
    if kind == "last":
        assert "is newer than" in resumed.stderr
    resumed_from = end_of_epoch if kind == "last" else step
    assert sorted(int(each) for each in _losses(resumed)) == list(range(resumed_from, 24))
    assert "last.ckpt" in _complete_under_final_names(folder)
    assert not [p for p in folder.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
    assert resumed.result() == {"global_step": 24, "epoch": 3}
    assert _losses(stopped, interrupted, resumed) == _losses(whole)


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        pytest.param("fsdp", "missing", marks=_on("fsdp")),
        pytest.param("deepspeed_stage_3", "flipped", marks=_on("deepspeed_stage_3")),
    ],
)
def test_a_damaged_shard_is_refused_naming_the_file(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, name: str, damage: str
) -> None:
    source = _reference(name, tmp_path_factory).root / "checkpoints" / "epoch=1-step=16.ckpt"
    copy = tmp_path / "copy.ckpt"
    shutil.copytree(source, copy)
    # A file rank 1 wrote: its shard of the state, or its optimizer's partition.
    [shard] = [*copy.glob("__1_0.distcp"), *copy.glob("*/*zero_pp_rank_1_*optim_states.pt")]
    if damage == "missing":
        shard.unlink()
    else:
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x04
        shard.write_bytes(bytes(data))
    said = "is missing" if damage == "missing" else "does not match its CRC-32"

    done = _job(name, tmp_path / "run", f"ckpt_path={str(copy)!r}")

    assert done.returncode != 0
    assert f"is damaged: {shard.relative_to(copy)} {said}" in done.stderr, done.stderr[-3000:]
    assert not _losses(done), "a step ran on a damaged checkpoint"


@pytest.mark.parametrize(
    ("name", "devices", "options"),
    [
        pytest.param("fsdp", 3, {}, id="fsdp 2 to 3 ranks", marks=_on("fsdp")),
        pytest.param("model_parallel", 4, {"data_parallel_size": 4, "tensor_parallel_size": 1},
                     id="model_parallel 2x2 to 4x1", marks=_on("model_parallel")),
    ],
)  # fmt: skip
def test_a_checkpoint_goes_on_in_another_layout(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    devices: int,
    options: dict[str, int],
) -> None:
    whole = _reference(name, tmp_path_factory)
    source = whole.root / "checkpoints" / "epoch=1-step=16.ckpt"
    root = tmp_path / "moved"
    root.mkdir()

    done = run(
        fit_command(name, devices, root, "max_epochs=3", f"ckpt_path={str(source)!r}"),
        root,
        {"STRATEGY_OPTIONS": json.dumps(options)},
        timeout=JOB_TIMEOUT,
    )
    _seen[id(done)] = done.seen()

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.result()["epoch"] == 3
    losses = _losses(done)
    assert min(int(step) for step in losses) == 16  # it went on from the checkpoint
    # The third epoch on the new layout trains on from the weights, not afresh: its
    # losses are those of a model two epochs in, not of a new one.
    first_of_whole = _losses(whole)["0"]
    assert max(losses.values()) < 0.5 * first_of_whole, (losses, first_of_whole)
