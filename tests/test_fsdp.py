"""FSDPStrategy trains as DDP does, holds 1/world_size of the state, and resumes at any world size.

The jobs (``fsdp_job.py``) give every rank the same batches, so a run's losses do
not depend on its world size: runs at 1, 2, 3 and 4 processes, and runs resumed
at another world size, are compared step by step.
"""

from __future__ import annotations

import json
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

JOB = Path(__file__).resolve().with_name("fsdp_job.py")

# One worker runs the module, so that the runs its tests share (below) run once. A test
# here (with the module's fixtures, on its worker first) starts a few jobs, each bounded
# by JOB_TIMEOUT; pytest's own bound (120 s, for a test in one process) is two jobs'
# here, so that a job that runs long is stopped and reported by the test, with its output.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("test_fsdp"),
    pytest.mark.timeout(2 * JOB_TIMEOUT),
]


def _run(
    root: Path, tag: str, *options: str, env: dict[str, str] | None = None
) -> dict[str, object]:
    return run_job(JOB, root, tag, *options, env=env)


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """FSDP's defaults (full sharding) on 2 processes for 1 epoch: what the variants match.

    Every test below that needs this run reads this one: the job is deterministic,
    and none of them reads or writes its directory.
    """
    root = tmp_path_factory.mktemp("fsdp-one-epoch")
    return _run(root, "full", "--devices", "2", "--epochs", "1")


def _state_bytes(result: dict[str, object]) -> int:
    held = result["state_bytes"]
    assert isinstance(held, dict)
    return int(held["parameters"] + held["gradients"] + held["optimizer"])


@pytest.mark.parametrize("devices", [2, 3])
def test_fsdp_trains_as_ddp_does_and_holds_a_world_size_share_of_the_state(
    tmp_path: Path, devices: int
) -> None:
    common = ("--devices", str(devices), "--epochs", "2")
    ddp = _run(tmp_path / "ddp", "ddp", "--strategy", "ddp", *common)
    fsdp = _run(tmp_path / "fsdp", "fsdp", *common, "--options", '{"wrap": "blocks"}')

    assert_losses_close(losses_of(fsdp), losses_of(ddp), 1e-5)
    ddp_weights, fsdp_weights = (
        final_weights(tmp_path / "ddp", "ddp"),
        final_weights(tmp_path / "fsdp", "fsdp"),
    )
    assert ddp_weights.keys() == fsdp_weights.keys()
    for key, value in ddp_weights.items():
        torch.testing.assert_close(fsdp_weights[key], value, rtol=1e-4, atol=1e-5)
    # Parameters, gradients and optimizer state: each rank holds about 1/world_size
    # (a parameter's rows are split as evenly as they go: 16 rows over 3 ranks is
    # 6, 6 and 4, and the head's single row sits on rank 0).
    full = _state_bytes(ddp)
    share = {2: 0.55, 3: 0.40}[devices]
    for rank in range(devices):
        held = _state_bytes(rank_result(tmp_path / "fsdp", "fsdp", rank))
        assert held <= full * share, (rank, held, full)
    assert (
        sum(_state_bytes(rank_result(tmp_path / "fsdp", "fsdp", r)) for r in range(devices)) >= full
    )


def test_a_sharded_checkpoint_resumes_exactly_and_at_other_world_sizes(tmp_path: Path) -> None:
    straight = _run(tmp_path / "straight", "straight", "--devices", "2", "--epochs", "3",
                    "--keep-every-epoch")  # fmt: skip
    # What the run saved after its second epoch (of 4 steps each).
    saved = tmp_path / "straight" / "checkpoints" / "epoch=1-step=8.ckpt"
    assert saved.is_dir()  # every rank wrote its shards
    expected = {k: v for k, v in losses_of(straight).items() if int(k) >= 8}

    same = _run(tmp_path / "same", "same", "--devices", "2", "--epochs", "3",
                "--resume-from", str(saved))  # fmt: skip
    assert losses_of(same) == expected  # exact at the same world size

    for devices in (1, 3):
        resumed = _run(tmp_path / f"on{devices}", f"on{devices}", "--devices", str(devices),
                       "--epochs", "3", "--resume-from", str(saved))  # fmt: skip
        assert_losses_close(losses_of(resumed), expected, 1e-5)
        # Then it keeps training and checkpointing at its own world size.
        assert (tmp_path / f"on{devices}" / "checkpoints" / "last.ckpt" / ".metadata").is_file()


def test_an_optimizer_without_per_parameter_state_resumes_exactly(tmp_path: Path) -> None:
    # Plain SGD keeps no state: the sharded checkpoint holds its groups alone.
    straight = _run(tmp_path / "straight", "straight", "--sgd", "--epochs", "2",
                    "--keep-every-epoch")  # fmt: skip
    saved = tmp_path / "straight" / "checkpoints" / "epoch=0-step=4.ckpt"  # after 1 epoch
    resumed = _run(tmp_path / "resumed", "resumed", "--sgd", "--epochs", "2",
                   "--resume-from", str(saved))  # fmt: skip

    assert losses_of(resumed) == {k: v for k, v in losses_of(straight).items() if int(k) >= 4}


def test_bf16_activation_checkpointing_prefetch_and_uneven_validation(
    tmp_path: Path, one_epoch: dict[str, object]
) -> None:
    fp32 = one_epoch
    options = '{"checkpoint_blocks": true, "wrap": "blocks", "backward_prefetch": "BACKWARD_PRE"}'
    result = _run(tmp_path / "bf16", "bf16", "--devices", "2", "--epochs", "1",
                  "--precision", "bf16-mixed", "--options", options,
                  "--uneven-validation")  # fmt: skip

    assert result["dtypes"] == ["torch.bfloat16"]  # the blocks computed with bf16 parameters
    assert_losses_close(losses_of(result), losses_of(fp32), 2e-2)
    # Three checkpointed blocks: each runs forward twice per step (once more in backward).
    assert result["checkpointed"] == 3
    assert result["forwards_per_step"] == [6, 6, 6]
    assert fp32["forwards_per_step"] == [3, 3, 3]
    # 9 validation samples over 2 ranks: every one seen once, no rank waiting forever.
    assert result["val_seen"] == 9


def test_a_model_built_on_meta_with_cpu_offload_trains_from_each_ranks_shards(
    tmp_path: Path,
) -> None:
    result = _run(tmp_path, "offload", "--strategy", "fsdp_cpu_offload", "--devices", "2",
                  "--epochs", "2", "--lazy")  # fmt: skip

    assert result["offload"] is True
    assert result["devices"] == ["cpu"]
    losses = list(losses_of(result).values())
    assert losses[-1] < losses[0]


def test_a_full_state_dict_is_one_file_plain_pytorch_loads(
    tmp_path: Path, one_epoch: dict[str, object]
) -> None:
    options = '{"state_dict_type": "full", "sharding_strategy": "SHARD_GRAD_OP", "wrap": 200}'
    sharded = one_epoch
    full = _run(tmp_path / "full", "full", "--devices", "2", "--epochs", "1",
                "--options", options)  # fmt: skip

    assert_losses_close(losses_of(full), losses_of(sharded), 1e-5)
    assert full["blocks"] == 3  # the size-based policy chose the three blocks
    last = tmp_path / "full" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    state = torch.load(last, map_location="cpu", weights_only=False)["state_dict"]
    layer = torch.nn.Linear(16, 1)
    layer.load_state_dict({"weight": state["head.weight"], "bias": state["head.bias"]})


@pytest.mark.parametrize("kind", ["sharded", "full"])
def test_after_fit_the_fitted_module_validates_as_a_new_one_from_the_checkpoint(
    tmp_path: Path, kind: str
) -> None:
    options = json.dumps({"state_dict_type": kind})
    _run(tmp_path, "next", "--devices", "2", "--epochs", "1", "--options", options,
         "--then-validate")  # fmt: skip

    for rank in range(2):
        result = rank_result(tmp_path, "next", rank)
        assert result["fresh_val_seen"] == 64  # 32 samples (not sharded: a list) on 2 ranks
        # The module fit sharded goes on as it is, with the checkpoint's numbers.
        assert result["fitted_val_seen"] == 64
        fresh = float(str(result["fresh_val_loss"]))
        assert float(str(result["fitted_val_loss"])) == pytest.approx(fresh, rel=1e-6)


@pytest.mark.parametrize(
    ("strategy", "options"),
    [
        ("fsdp_no_shard", "{}"),
        ("fsdp", '{"sharding_strategy": "HYBRID_SHARD", "device_mesh": [2, 2]}'),
        ("fsdp_hybrid_shard", "{}"),  # one node: its 4 ranks shard, one replica
        ("fsdp", '{"reshard_after_forward": false, "wrap": "blocks"}'),
    ],
)
def test_replicated_and_hybrid_sharding_train_as_full_sharding_does(
    tmp_path: Path, strategy: str, options: str, one_epoch: dict[str, object]
) -> None:
    reference = one_epoch
    result = _run(tmp_path / "other", "other", "--strategy", strategy, "--devices", "4",
                  "--epochs", "1", "--options", options)  # fmt: skip

    assert_losses_close(losses_of(result), losses_of(reference), 1e-5)


def test_a_model_larger_than_the_per_process_budget_is_built_and_trained(tmp_path: Path) -> None:
    # 16 blocks of 2048 x 2048: 268 MB of parameters, more than the 242 MB each
    # process may grow by. Built on the meta device, each of 4 ranks materialises its
    # quarter; training (SGD) adds a quarter of the gradients and one gathered block.
    # Large allocations are mapped and unmapped (no heap fragments): the peak resident
    # size then follows the live tensors. Two steps: the first makes the gradients,
    # the second runs with them held (SGD keeps no state); each step costs seconds of
    # the kernel's page mapping, and a third would add nothing to the peak.
    env = {"FSDP_JOB_WIDTH": "2048", "MALLOC_MMAP_THRESHOLD_": "131072"}
    _run(tmp_path, "big", "--devices", "4", "--epochs", "1", "--depth", "16", "--lazy",
         "--sgd", "--batches", "2", "--no-checkpoints", "--options", '{"wrap": "blocks"}',
         env=env)  # fmt: skip

    for rank in range(4):
        result = rank_result(tmp_path, "big", rank)
        held = result["state_bytes"]
        assert isinstance(held, dict)
        budget = 0.9 * held["full_parameters"]
        assert result["peak_growth"] < budget, (rank, result["peak_growth"], budget)


@pytest.mark.cuda
def test_on_gpus_over_nccl_fsdp_trains_as_ddp_does(tmp_path: Path) -> None:
    devices = str(min(torch.cuda.device_count(), 2))
    common = ("--accelerator", "cuda", "--devices", devices, "--epochs", "1")
    ddp = _run(tmp_path / "ddp", "ddp", "--strategy", "ddp", *common)
    fsdp = _run(tmp_path / "fsdp", "fsdp", *common, "--options", '{"wrap": "blocks"}')

    assert fsdp["devices"] == ["cuda"]
    assert_losses_close(losses_of(fsdp), losses_of(ddp), 1e-4)
