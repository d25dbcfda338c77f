"""DeepSpeedStrategy trains as DDP does, holds its ZeRO share of the state, and resumes exactly.

The jobs (``deepspeed_job.py``) give every rank the same batches, so DDP's losses are
the reference for every ZeRO stage. Nothing is compiled: the tests' extensions
directory (set in conftest.py) stays empty.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.sharded_jobs import (
    JOB_TIMEOUT,
    assert_losses_close,
    final_weights,
    losses_of,
    rank_result,
    run_job,
)

from plait.core import CheckpointError
from plait.core.checkpoint_dirs import MANIFEST, files_of
from plait.strategies import consolidate_checkpoint

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "deepspeed_job.py"

# One worker runs the module, so that its module fixtures (the DDP reference, the ZeRO
# stages' runs) run once. A test here (with those fixtures, on its worker first) starts
# a few jobs, each bounded by JOB_TIMEOUT; pytest's own bound (120 s, for a test in one
# process) is two jobs' here, so that a job that runs long is stopped and reported by
# the test, with its output.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("test_deepspeed"),
    pytest.mark.timeout(2 * JOB_TIMEOUT),
]


def _run(
    root: Path, tag: str, *options: str, env: dict[str, str] | None = None
) -> dict[str, object]:
    return run_job(JOB, root, tag, *options, env=env)


def _held(result: dict[str, object], kind: str) -> int:
    held = result["state_bytes"]
    assert isinstance(held, dict)
    return int(held[kind])


def _updates(result: dict[str, object]) -> list[float]:
    updates = result["updates"]
    assert isinstance(updates, list)
    return [float(u) for u in updates]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """DDP over the same 3 epochs: the trajectory every stage must follow."""
    root = tmp_path_factory.mktemp("ddp")
    return root, _run(root, "ddp", "--strategy", "ddp", "--epochs", "3")


@pytest.fixture(scope="module")
def stages(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, dict[str, object]]]:
    """Each ZeRO stage over the reference's 3 epochs, keeping every epoch's checkpoint:
    its folder and rank 0's results, by stage. The resume tests resume from its first
    epoch's checkpoint."""
    runs = {}
    for stage in (0, 1, 2, 3):
        root = tmp_path_factory.mktemp(f"stage{stage}")
        runs[stage] = root, _run(root, f"stage{stage}", "--strategy", "deepspeed", "--epochs",
                                 "3", "--options", json.dumps({"stage": stage}),
                                 "--keep-every-epoch")  # fmt: skip
    return runs


def test_every_stage_trains_as_ddp_does_and_holds_its_share_of_the_state(
    reference: tuple[Path, dict[str, object]], stages: dict[int, tuple[Path, dict[str, object]]]
) -> None:
    root, ddp = reference
    losses = [loss for _, loss in sorted(losses_of(ddp).items(), key=lambda item: int(item[0]))]
    assert sum(losses[-4:]) < 0.65 * sum(losses[:4])  # it learns: the epochs' mean losses
    for stage in (0, 1, 2, 3):
        tag = f"stage{stage}"
        folder, result = stages[stage]
        assert_losses_close(losses_of(result), losses_of(ddp), 1e-5)
        # The weights exported from the engine's checkpoint, read by plain PyTorch.
        exported, expected = final_weights(folder, tag), final_weights(root, "ddp")
        assert exported.keys() == expected.keys()
        for key, value in exported.items():
            torch.testing.assert_close(value, expected[key], rtol=1e-5, atol=1e-6)
        optimizer_share = _held(result, "optimizer") / _held(ddp, "optimizer")
        parameter_share = _held(result, "parameters") / _held(ddp, "parameters")
        # Stage 1 on partitions the optimizer state, stage 3 the parameters too.
        assert optimizer_share == pytest.approx(1.0 if stage == 0 else 0.5, abs=0.02), stage
        assert parameter_share == pytest.approx(0.5 if stage == 3 else 1.0, abs=0.02), stage
    # Nothing was compiled for any of it.
    extensions = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    assert not list(extensions.glob("**/*.so")) if extensions.exists() else True


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_checkpoint_resumes_exactly_then_training_and_checkpointing_go_on(
    tmp_path: Path,
    stage: int,
    reference: tuple[Path, dict[str, object]],
    stages: dict[int, tuple[Path, dict[str, object]]],
) -> None:
    root, ddp = reference
    options = ("--strategy", "deepspeed", "--options", json.dumps({"stage": stage}))
    # The checkpoint the stage's run saved after its first epoch (of 4 steps).
    last = stages[stage][0] / "checkpoints" / "epoch=0-step=4.ckpt"
    assert (last / "latest").is_file()  # the engine's directory, every rank's partitions
    resumed = _run(tmp_path / "resumed", "resumed", *options, "--epochs", "3",
                   "--resume-from", str(last))  # fmt: skip

    straight = losses_of(ddp)
    assert_losses_close(
        losses_of(resumed), {step: straight[step] for step in losses_of(resumed)}, 1e-5
    )
    assert min(int(step) for step in losses_of(resumed)) == 4  # after the first epoch's 4
    # The resumed run checkpointed again; its last checkpoint holds the final weights.
    exported, expected = final_weights(tmp_path / "resumed", "resumed"), final_weights(root, "ddp")
    for key, value in exported.items():
        torch.testing.assert_close(value, expected[key], rtol=1e-5, atol=1e-6)


def test_accumulating_4_batches_equals_one_batch_4_times_as_large(tmp_path: Path) -> None:
    common = ("--strategy", "deepspeed_stage_2", "--epochs", "2", "--optimizer", "sgd")
    accumulated = _run(tmp_path / "acc", "acc", *common, "--batches", "4", "--batch-size", "8",
                       "--accumulate", "4")  # fmt: skip
    whole = _run(tmp_path / "whole", "whole", *common, "--batches", "1", "--batch-size", "32")

    assert accumulated["global_step"] == whole["global_step"] == 2
    assert _updates(accumulated) == pytest.approx(_updates(whole), rel=1e-5)
    exported, expected = (
        final_weights(tmp_path / "acc", "acc"),
        final_weights(tmp_path / "whole", "whole"),
    )
    for key, value in exported.items():
        torch.testing.assert_close(value, expected[key], rtol=1e-5, atol=1e-6)


def test_clipping_bounds_every_update_once(tmp_path: Path) -> None:
    # SGD with a learning rate of 1: an update is minus the (clipped) gradient. Stage 1
    # clips in ZeRO's optimizer over partitions, stage 3 over partitioned parameters.
    common = ("--epochs", "1", "--optimizer", "sgd")
    free = _run(tmp_path / "free", "free", "--strategy", "deepspeed_stage_1", *common)
    assert min(_updates(free)) > 0.2  # without clipping, every step is larger
    for strategy in ("deepspeed_stage_1", "deepspeed_stage_3"):
        clipped = _run(tmp_path / strategy, strategy, "--strategy", strategy, *common,
                       "--clip", "0.05")  # fmt: skip
        assert max(_updates(clipped)) <= 0.05 * (1 + 1e-4), strategy
        assert min(_updates(clipped)) >= 0.05 * (1 - 1e-3), strategy  # to the bound, not below


def test_bf16_and_offload_of_stages_2_and_3_train(
    tmp_path: Path, reference: tuple[Path, dict[str, object]]
) -> None:
    _, ddp = reference
    first_epoch = {step: loss for step, loss in losses_of(ddp).items() if int(step) < 8}
    bf16 = _run(tmp_path / "bf16", "bf16", "--strategy", "deepspeed_stage_2",
                "--precision", "bf16-mixed")  # fmt: skip
    assert bf16["dtypes"] == ["torch.bfloat16"]  # the inputs follow the engine's dtype
    assert_losses_close(losses_of(bf16), first_epoch, 0.02)
    for name in ("deepspeed_stage_2_offload", "deepspeed_stage_3_offload"):
        offloaded = _run(tmp_path / name, name, "--strategy", name, "--lazy")
        assert_losses_close(losses_of(offloaded), first_epoch, 1e-5)


def test_a_model_built_under_zero_init_never_is_whole_on_a_rank(tmp_path: Path) -> None:
    # 8 layers of 2048 x 2048: 134 MB of parameters. Built under model_sharded_context
    # at stage 3, each of 2 ranks keeps its half as each layer is made; at stage 2
    # (where the context does nothing) each builds it all, which the measure sees.
    # Large allocations are mapped and unmapped: the peak follows the live tensors.
    env = {"DEEPSPEED_JOB_WIDTH": "2048", "MALLOC_MMAP_THRESHOLD_": "131072"}
    common = ("--lazy", "--epochs", "1", "--batches", "1", "--depth", "8", "--optimizer", "sgd",
              "--no-export")  # fmt: skip
    _run(tmp_path / "zero3", "zero3", "--strategy", "deepspeed_stage_3", *common, env=env)
    _run(tmp_path / "zero2", "zero2", "--strategy", "deepspeed_stage_2", *common, env=env)

    for rank in (0, 1):
        partitioned = rank_result(tmp_path / "zero3", "zero3", rank)
        whole = rank_result(tmp_path / "zero2", "zero2", rank)
        model_bytes = float(str(partitioned["model_bytes"]))
        assert model_bytes > 130e6
        # Half the model, and a layer being made (16 MB) before it is partitioned.
        assert float(str(partitioned["build_growth"])) < 0.75 * model_bytes, partitioned
        assert float(str(whole["build_growth"])) > 0.9 * model_bytes, whole


@pytest.mark.parametrize("stage", [2, 3])
def test_after_fit_the_fitted_module_validates_as_a_new_one_from_the_checkpoint(
    tmp_path: Path, stage: int
) -> None:
    _run(tmp_path, "next", "--strategy", f"deepspeed_stage_{stage}", "--lazy", "--epochs", "1",
         "--then-validate")  # fmt: skip

    for rank in (0, 1):
        result = rank_result(tmp_path, "next", rank)
        validated = float(str(result["val_from_checkpoint"]))
        assert 0 < validated < 1
        # The fitted module (partitioned in place at stage 3) validates alike.
        assert float(str(result["val_fitted"])) == pytest.approx(validated, rel=1e-6)


def test_the_standalone_example_trains_at_stage_3_and_exports(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "deepspeed_standalone.py"),
         "--processes", "2", "--start-method", "fork", "--epochs", "4",
         "--checkpoint", str(tmp_path)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+) \(mean over 2 ranks\)", result.stdout)]
    assert len(losses) == 4
    assert losses[-1] < losses[0] / 4
    assert (tmp_path / "last" / "latest").is_file()  # the engine's partitions
    assert "is deprecated" not in result.stderr  # DeepSpeed's notices stay inside plait
    state = torch.load(tmp_path / "model.pt", weights_only=True)["state_dict"]
    assert {key: tuple(value.shape) for key, value in state.items()} == {
        "0.weight": (32, 8), "0.bias": (32,), "2.weight": (1, 32), "2.bias": (1,),
    }  # fmt: skip
    assert all(value.dtype == torch.float32 for value in state.values())


def test_every_checkpoint_is_put_in_place_whole_and_a_damaged_file_is_refused_naming_it(
    tmp_path: Path, stages: dict[int, tuple[Path, dict[str, object]]]
) -> None:
    for stage, (folder, _) in stages.items():
        checkpoints = folder / "checkpoints"
        # Written aside and put in place once every rank had written: nothing else.
        assert not [p.name for p in checkpoints.iterdir() if not p.name.endswith(".ckpt")], stage
        for checkpoint in checkpoints.iterdir():
            listed = json.loads((checkpoint / MANIFEST).read_text())["files"]
            assert set(listed) == set(files_of(checkpoint)), (stage, checkpoint)
    damaged = tmp_path / "epoch=0-step=4.ckpt"
    shutil.copytree(stages[3][0] / "checkpoints" / "epoch=0-step=4.ckpt", damaged)
    [partition] = damaged.glob("*/*zero_pp_rank_1_*optim_states.pt")
    partition.write_bytes(partition.read_bytes()[:-7])

    with pytest.raises(CheckpointError, match=rf"is damaged: .*{partition.name} has .* bytes"):
        consolidate_checkpoint(damaged, tmp_path / "whole.ckpt")
    assert not (tmp_path / "whole.ckpt").exists()
