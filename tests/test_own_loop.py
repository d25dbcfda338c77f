"""One training loop of a team's own, the same on every strategy but for one line.

``own_loop_job.py`` is the loop: it accumulates two micro-batches per step with
``no_sync``, checkpoints the model, optimizer, scheduler and step with one
``save_checkpoint`` call, and resumes them in ranks launched afresh with one
``load_checkpoint`` call. On each strategy the resumed run goes on with the very
losses of the run that never stopped, loading leaves nothing over, two
micro-batches train as one batch of twice the size, and the whole model exports to
one file plain PyTorch loads. A checkpoint moves between strategies, its optimizer
state with it: between DDP, FSDP, one device and DeepSpeed (ZeRO's partitions
rebuilt whole, and partitioned anew), and between ZeRO stages. Loaded with
``weights_only=True``, every strategy starts the same fresh optimizer from the
same weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.processes import processes_mentioning
from torch import nn

from plait.strategies.deepspeed import library
from plait.strategies.deepspeed.export import optimizer_state_dict

JOB = Path(__file__).resolve().with_name("own_loop_job.py")
STEPS, SAVE_AT = 8, 4
STRATEGIES = ("single_device", "ddp", "ddp_spawn", "fsdp")
DEEPSPEED = ("deepspeed_stage_0", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3")
# With the optimizer state, in every direction between the kinds of checkpoint: one
# file (DDP, one process), torch.distributed.checkpoint (FSDP), DeepSpeed's ZeRO
# partitions (at another stage, and at another world size: one process).
WHOLE_MOVES = (
    "ddp:fsdp", "fsdp:ddp", "fsdp:single_device", "single_device:fsdp",
    "deepspeed_stage_3:ddp", "ddp:deepspeed_stage_2", "fsdp:deepspeed_stage_3",
    "deepspeed_stage_2:fsdp", "deepspeed_stage_1:deepspeed_stage_3",
    "deepspeed_stage_3:single_device",
)  # fmt: skip
# The weights alone, from one checkpoint: each target's fresh optimizer takes them
# (ZeRO's fp32 copy of the weights included) and goes on as one process's does.
# From a third party's format too (``json``: the example plugin's, holding DDP's
# weights), into a sharded strategy and ZeRO's partitions.
WEIGHT_MOVES = ("ddp:single_device:weights", "ddp:deepspeed_stage_2:weights",
                "json:deepspeed_stage_3:weights", "json:fsdp:weights")  # fmt: skip

JOB_TIMEOUT = 400
"""Seconds the loop's job may take; the test's own bound is a minute more, so that
a job that runs long is stopped and reported by the test (with its output)."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(JOB_TIMEOUT + 60)]

Losses = dict[str, float]


def _losses(run: dict[str, object]) -> Losses:
    losses = run["losses"]
    assert isinstance(losses, dict)
    return losses


def _close(a: Losses, b: Losses, steps: list[str]) -> bool:
    return all(a[step] == pytest.approx(b[step], rel=1e-5, abs=1e-6) for step in steps)


def run_and_check(
    root: Path,
    names: tuple[str, ...],
    whole_moves: tuple[str, ...],
    weight_moves: tuple[str, ...] = (),
    *,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
) -> None:
    """Run the loop on ``names`` and the moves, and check every promise it makes."""
    moves = [f"--move={move}" for move in (*whole_moves, *weight_moves)]
    command = [python, str(JOB), str(root), *names, *moves]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False, env=env
    )
    assert not processes_mentioning(str(root)), "a rank was left running"
    assert done.returncode == 0, done.stderr[-6000:]
    # No notice the libraries give at every step (DeepSpeed's calls into torch's
    # deprecated collectives: hundreds a ZeRO-3 run) reaches the loop's output.
    assert "is deprecated" not in done.stderr, done.stderr[-3000:]
    runs = {name: json.loads((root / f"{name}.json").read_text()) for name in names}
    every = [str(step) for step in range(1, STEPS + 1)]
    later = every[SAVE_AT:]

    reference = _losses(runs[names[0]]["full"])
    undeep = next(name for name in names if not name.startswith("deepspeed"))
    for name, run in runs.items():
        full, resumed, big = (_losses(run[mode]) for mode in ("full", "resumed", "big"))
        assert sorted(full, key=int) == every, name
        # Every strategy (one process on both ranks' samples, too) runs the same run.
        assert _close(full, reference, every), (name, full, reference)
        # Restored in place, in one call, in fresh ranks: the very same next losses.
        assert resumed == {step: full[step] for step in later}, name
        assert run["resumed"]["left"] == [], name  # everything saved was taken back
        # The module alone: restored in place (the same weights the whole state then
        # restores), no optimizer touched, and the run's entries given back, the same
        # keys on every strategy.
        assert run["resumed"]["alone"] == {
            "left": ["scheduler", "step"], "untouched": True, "module": True
        }, name  # fmt: skip
        assert (root / f"{name}-resumed-step{STEPS}").exists(), name  # and it goes on
        # Two micro-batches (the first inside no_sync) step as one twice the size.
        assert _close(big, full, every), (name, big, full)
        assert full[str(STEPS)] < full["1"], name  # and it learns
        # Fabric's clip_gradients_norm gives the whole model's gradient norm, the same
        # on every strategy (DeepSpeed's engine clips in its step, and says so).
        norms = run["big"]["norms"]
        if name.startswith("deepspeed"):
            assert set(norms.values()) == {"refused"}, name
        else:
            assert sorted(norms, key=int) == every, name
            assert _close(norms, runs[undeep]["big"]["norms"], every), (name, norms)
        # A module's bare state_dict() file (Fabric's load_raw) loads into the model.
        loaded, expected = run["full"]["bare"]
        assert loaded == pytest.approx(expected, rel=1e-5), name

        # One file a plain module loads: exported in the run, or consolidated after.
        exported = torch.load(root / f"{name}-export.pt")["state_dict"]
        consolidated = torch.load(root / f"{name}-consolidated.pt", weights_only=False)
        plain = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        plain.load_state_dict(exported)
        plain.load_state_dict(consolidated["state_dict"])
        for key, tensor in exported.items():
            assert torch.equal(tensor, consolidated["state_dict"][key]), (name, key)
        assert consolidated["step"] == STEPS, name  # the run's entries come along
        assert len(consolidated["optimizer_states"]) == 1, name  # and the optimizer's

    for move in whole_moves:
        source, target = move.split(":")
        moved = json.loads((root / f"{target}-moved-from-{source}.json").read_text())
        assert moved["left"] == [], move
        # The optimizer's moments came along: the source's very trajectory goes on.
        assert _close(_losses(moved), _losses(runs[source]["full"]), later), move
    fresh: dict[str, Losses] = {}
    for move in weight_moves:
        source, target, _ = move.split(":")
        moved = json.loads((root / f"{target}-weights-from-{source}.json").read_text())
        assert moved["left"] == [], move
        losses = _losses(moved)
        # The weights came along (the first loss is theirs); the optimizer began afresh,
        # and every strategy's fresh optimizer goes on alike from them. The third
        # party's checkpoint holds DDP's weights: the same run as from DDP's own.
        origin = "ddp" if source == "json" else source
        assert _close(losses, _losses(runs[origin]["full"]), [later[0]]), move
        assert not _close(losses, _losses(runs[origin]["full"]), later[1:]), move
        first = fresh.setdefault(origin, losses)
        assert _close(losses, first, later), (move, losses, first)


def test_the_same_loop_resumes_accumulates_exports_and_moves_on_every_strategy(
    tmp_path: Path,
) -> None:
    if not library.is_available():  # without importing it: plait's import prepares it
        pytest.skip("the deepspeed extra is not installed")
    run_and_check(tmp_path, (*STRATEGIES, *DEEPSPEED), WHOLE_MOVES, WEIGHT_MOVES)

    # ZeRO's partitions, rebuilt whole, are the state DDP's optimizer held at that step.
    ddp = torch.load(tmp_path / f"ddp-step{SAVE_AT}", weights_only=False)["optimizer_states"][0]
    for name in DEEPSPEED:
        rebuilt = optimizer_state_dict(tmp_path / f"{name}-step{SAVE_AT}")
        assert rebuilt is not None, name
        [group] = rebuilt["param_groups"]
        assert {**group, "params": ddp["param_groups"][0]["params"]} == ddp["param_groups"][0]
        for index, parameter in enumerate(group["params"]):
            for key, value in ddp["state"][index].items():
                assert torch.allclose(rebuilt["state"][parameter][key], value, atol=1e-7), (
                    name, parameter, key,
                )  # fmt: skip
