"""``xla``, ``xla_debug`` and ``xla_fsdp`` on XLA:CPU; several replicas on a TPU lane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.xla.test_single_xla import Regressor, _fit, _loader, _trainer, run_conformance

from plait.core import (
    ConfigurationError,
    StrategyRegistry,
    SupportsProcessDataloader,
    seed_everything,
)
from plait.strategies import XLAStrategy
from plait.strategies.xla.library import MULTI_REPLICA_CPU
from plait.trainer import ModelCheckpoint

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def _run(
    args: list[str], *, devices: int = 1, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": str(devices),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=environ,
        cwd=ROOT,
    )


def _spmd(job: str, root: Path, *more: str) -> dict[str, object]:
    result = _run([str(HERE / "spmd_job.py"), job, str(root), *more], devices=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    found: dict[str, object] = json.loads((root / "result.json").read_text())
    return found


def _close(a: object, b: object, tolerance: float) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tolerance) for k in a)
    assert isinstance(a, list)
    assert isinstance(b, list)
    return torch.allclose(torch.tensor(a), torch.tensor(b), rtol=tolerance, atol=tolerance)


# xla: one replica on XLA:CPU, through torch_xla's launcher.


def test_xla_with_one_replica_trains_as_single_xla(tmp_path: Path) -> None:
    replica = _fit(tmp_path / "xla", "xla", max_epochs=2, enable_checkpointing=False)
    single = _fit(tmp_path / "single", "single_xla", max_epochs=2, enable_checkpointing=False)

    assert replica.devices == {"xla"}
    assert len(replica.losses) == 16
    assert replica.losses == pytest.approx(single.losses, rel=1e-5, abs=1e-6)


def test_xla_resumes_exactly_and_keeps_checkpointing(tmp_path: Path) -> None:
    whole = _fit(tmp_path / "whole", "xla", max_epochs=3, enable_checkpointing=False)

    def every() -> ModelCheckpoint:
        return ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=5, save_top_k=-1)

    first = _fit(tmp_path / "part", "xla", max_steps=5, callbacks=[every()])
    model = Regressor()
    resumed = _trainer(tmp_path / "part", "xla", max_epochs=3, callbacks=[every()])
    resumed.fit(model, _loader(), ckpt_path="last")

    assert first.losses + model.losses == pytest.approx(whole.losses, rel=1e-5, abs=1e-6)
    steps = sorted(int(p.stem.split("step=")[1]) for p in (tmp_path / "ckpt").glob("*step=*.ckpt"))
    assert steps == [5, 10, 15, 20]
    # The checkpoint holds CPU tensors (the "xla" IO): it loads without torch_xla.
    checkpoint = torch.load(tmp_path / "ckpt" / "epoch=2-step=20.ckpt", weights_only=True)
    assert {t.device.type for t in checkpoint["state_dict"].values()} == {"cpu"}


def test_xla_feeds_batches_through_the_device_loader_and_names_its_launcher() -> None:
    strategy = StrategyRegistry.get("xla")
    assert isinstance(strategy, XLAStrategy)
    assert isinstance(strategy, SupportsProcessDataloader)
    assert repr(strategy.launcher) == "XLALauncher(num_processes=1)"
    assert strategy.launcher.is_interactive_compatible
    strategy.setup_environment()
    try:
        batches = list(strategy.process_dataloader(_loader()))
        assert {batch[0].device.type for batch in batches} == {"xla"}  # type: ignore[index]
        assert strategy.reduce(torch.tensor(3.0, device=strategy.root_device)).item() == 3.0
    finally:
        strategy.teardown()


def test_several_replicas_on_xla_cpu_are_refused_with_the_upstream_reason() -> None:
    strategy = XLAStrategy(parallel_devices=[torch.device("xla", 0), torch.device("xla", 1)])
    assert strategy.num_processes == 2

    with pytest.raises(ConfigurationError) as caught:
        strategy.launcher.launch(print, "never runs")

    message = str(caught.value)
    assert "2 XLA replicas were asked for on XLA:CPU" in message
    assert "pytorch/xla issue 9089" in message
    assert "xla_fsdp" in message  # the way to several CPU devices


def test_a_parallel_device_that_is_not_xla_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"not 'cpu'"):
        XLAStrategy(parallel_devices=[torch.device("cpu")])


def test_xla_debug_prints_torch_xla_compilation_analysis(tmp_path: Path) -> None:
    code = (
        "import sys; sys.path.insert(0, '.'); from pathlib import Path; "
        "from tests.xla.test_single_xla import _fit; "
        f"_fit(Path({str(tmp_path)!r}), 'xla_debug', max_steps=3, enable_checkpointing=False)"
    )
    debug = _run(["-c", code])
    assert debug.returncode == 0, debug.stderr[-4000:]
    output = debug.stdout + debug.stderr
    assert "Compilation Analysis" in output
    assert "Execution Analysis" in output

    plain = _run(["-c", code.replace("'xla_debug'", "'xla'")])
    assert plain.returncode == 0, plain.stderr[-4000:]
    assert "Compilation Analysis" not in plain.stdout + plain.stderr


def test_the_conformance_suite_passes_for_xla_with_one_replica() -> None:
    result = run_conformance("xla")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "xla-xla-1: 7 passed, 4 skipped" in result.stdout


# xla_fsdp: SPMD over two virtual CPU devices, one process.


def test_xla_fsdp_shards_parameters_and_trains_as_one_device(tmp_path: Path) -> None:
    found = _spmd("equal", tmp_path)

    # Every parameter is laid out over both devices (torch_xla's sharding spec).
    shardings = found["shardings"]
    assert isinstance(shardings, list)
    assert shardings
    assert all("devices=[" in spec and "0,1" in spec for spec in shardings)
    assert _close(found["losses"], found["reference_losses"], 1e-4)
    assert _close(found["weights"], found["reference_weights"], 1e-4)


@pytest.mark.parametrize("stop", [6, 8], ids=["mid-epoch", "epoch-end"])
def test_xla_fsdp_resumes_from_its_sharded_checkpoint_and_keeps_checkpointing(
    tmp_path: Path, stop: int
) -> None:
    found = _spmd("resume", tmp_path, str(stop))

    assert _close(found["losses"], found["whole_losses"], 1e-5)
    assert _close(found["weights"], found["whole_weights"], 1e-5)
    # Checkpoints are DCP directories, written on after the resume.
    saved = found["saved"]
    assert isinstance(saved, list)
    steps = sorted(int(name.split("step=")[1].removesuffix(".ckpt")) for name in saved[:-1])
    assert steps == list(range(stop, 25, stop))
    assert found["last_is_directory"]
    # Read whole, without torch_xla's planner, the last one holds the final weights.
    last = found["last_weights"]
    assert isinstance(last, dict)
    assert _close({f"net.{k.split('net.')[1]}": v for k, v in last.items()}, found["weights"], 0)
    assert all(spec.startswith("{devices=") for spec in found["shardings"])  # type: ignore[attr-defined]


def test_xla_fsdp_full_checkpoints_are_one_torch_file_of_cpu_tensors(tmp_path: Path) -> None:
    found = _spmd("full", tmp_path)

    assert found == {"is_file": True, "devices": ["cpu"], "match": True}


@pytest.mark.parametrize("asked", [1, 3])
def test_xla_fsdp_refuses_other_than_every_device(asked: int) -> None:
    code = (
        "import torch; from plait.strategies import XLAFSDPStrategy; "
        f"XLAFSDPStrategy(parallel_devices=[torch.device('xla', i) for i in range({asked})])"
    )
    result = _run(["-c", code], devices=2)

    assert result.returncode == 1
    assert f"{asked} XLA devices were asked for, and xla_fsdp shards over every" in result.stderr
    assert "CPU_NUM_DEVICES" in result.stderr


def test_xla_fsdp_refuses_an_unknown_state_dict_type() -> None:
    code = "from plait.strategies import XLAFSDPStrategy; XLAFSDPStrategy(state_dict_type='shard')"
    result = _run(["-c", code], devices=2)

    assert result.returncode == 1
    assert "invalid state_dict_type: 'shard'" in result.stderr
    assert "sharded" in result.stderr


# Several replicas: a TPU lane (XLA:CPU cannot join replicas).


@pytest.mark.tpu
@pytest.mark.parametrize("strategy", ["xla", "xla_debug"])
def test_xla_replicas_train_over_every_device(tmp_path: Path, strategy: str) -> None:
    from plait.accelerators import XLAAccelerator  # noqa: PLC0415

    devices = XLAAccelerator().device_count()
    assert devices > 1, f"a TPU lane has several devices: {devices}"
    seed_everything(7)
    trainer = _trainer(
        tmp_path / "replicas", strategy, devices=devices, max_epochs=2, enable_checkpointing=False
    )
    trainer.fit(Regressor(), _loader())
    single = _fit(tmp_path / "single", "single_xla", max_epochs=2, enable_checkpointing=False)

    # Each replica reads 1/devices of each epoch: a step is one batch per replica.
    assert trainer.global_step == 16 // devices
    # Rank 0's last logged loss, after training on every replica's averaged gradients.
    assert float(trainer.callback_metrics["train_loss"]) < single.losses[0]


def collectives_in_replicas(strategy: XLAStrategy) -> list[dict[str, object]]:
    """In every replica: the contract's collectives; rank 0 returns what each saw."""
    strategy.setup_environment()
    try:
        rank, size, device = strategy.global_rank, strategy.world_size, strategy.root_device
        seen: dict[str, object] = {
            "rank": rank,
            "size": size,
            # An integer mean is a float, not truncated; XLA sums, the contract means.
            "mean": strategy.reduce(torch.tensor(rank, device=device)).item(),
            "sum": strategy.reduce(
                torch.tensor(float(rank), device=device), reduce_op="sum"
            ).item(),
            "broadcast": strategy.broadcast(torch.tensor([rank], device=device), src=size - 1)
            .cpu()
            .tolist(),
            "gathered": strategy.all_gather(torch.tensor([rank], device=device)).cpu().tolist(),
            "object": strategy.broadcast({"from": rank}, src=size - 1),
        }
        strategy.barrier("done")
        everyone: list[dict[str, object]] = [
            strategy.broadcast(seen, src=other) for other in range(size)
        ]
        return everyone
    finally:
        strategy.teardown()


@pytest.mark.tpu
def test_the_contract_holds_across_xla_replicas() -> None:
    from plait.accelerators import XLAAccelerator  # noqa: PLC0415

    devices = XLAAccelerator().device_count()
    strategy = XLAStrategy(parallel_devices=[torch.device("xla", i) for i in range(devices)])
    everyone = strategy.launcher.launch(collectives_in_replicas, strategy)

    assert [seen["rank"] for seen in everyone] == list(range(devices))
    for seen in everyone:
        assert seen["size"] == devices
        assert seen["mean"] == pytest.approx((devices - 1) / 2)
        assert seen["sum"] == devices * (devices - 1) / 2
        assert seen["broadcast"] == [devices - 1]
        assert seen["gathered"] == [[r] for r in range(devices)]
        assert seen["object"] == {"from": devices - 1}


def test_the_tpu_lane_skip_names_the_upstream_reason() -> None:
    assert "pytorch/xla issue 9089" in MULTI_REPLICA_CPU


# The launching process: nothing starts XLA's runtime before torch_xla's launcher.


def test_the_launching_process_counts_devices_without_starting_the_runtime() -> None:
    code = (
        "import torch_xla, torch_xla.runtime as xr; "
        "from plait.accelerators import XLAAccelerator; "
        "from plait.environments import XLAEnvironment; "
        "count = XLAAccelerator().device_count(); "
        "env = XLAEnvironment.from_environ({'MASTER_PORT': '29999'}); "
        "env.validate_settings(3, 1); "
        "assert not torch_xla._XLAC._xla_runtime_is_initialized(); "
        "print(count, env.world_size, env.global_rank, env.main_port, env.one_per_device)"
    )
    result = _run(["-c", code], devices=3)

    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["3", "1", "0", "29999", "False"]


def test_a_bad_cpu_num_devices_is_named() -> None:
    code = "from plait.accelerators import XLAAccelerator; XLAAccelerator().device_count()"
    environ = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "two"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=environ,
    )

    assert result.returncode == 1
    assert "CPU_NUM_DEVICES='two' is not a number of XLA:CPU devices" in result.stderr
