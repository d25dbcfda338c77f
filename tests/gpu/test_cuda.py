"""Training on one CUDA device: mixed precision, NCCL at world size 1, ranks sharing the GPU.

Every test here needs a GPU (skipped, saying so, elsewhere); ``tools/gpu-check`` runs
them on a machine that has one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.sharded_jobs import assert_losses_close, final_weights, losses_of, run_job
from typing_extensions import override

from plait.precision import MixedPrecision
from plait.strategies import SingleDeviceStrategy

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

StartRanks = Callable[..., list[str]]  # the fixture of the root conftest.py

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent


def _train(
    strategy: SingleDeviceStrategy, steps: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer, list[float], torch.Tensor]:
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model, [optimizer] = strategy.setup(layer, [torch.optim.SGD(layer.parameters(), lr=0.05)])
    x = torch.randn(64, 8, device="cuda")
    y = x.sum(dim=1, keepdim=True)
    losses = []
    output = torch.empty(0)
    for _ in range(steps):
        result = strategy.training_step(model, x)
        assert isinstance(result, torch.Tensor)
        output = result
        loss = torch.nn.functional.mse_loss(output.float(), y)
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        losses.append(loss.item())
    return model, optimizer, losses, output


def test_16_mixed_scales_the_loss_and_skips_a_step_whose_gradients_overflow() -> None:
    strategy = SingleDeviceStrategy("cuda", precision="16-mixed")
    model, optimizer, losses, output = _train(strategy, 30)
    precision = strategy.precision
    assert isinstance(precision, MixedPrecision)
    scaler = precision.scaler
    assert scaler is not None

    assert output.dtype == torch.float16  # computed under autocast
    assert all(p.dtype == torch.float32 for p in model.parameters())  # stepped in float32
    assert losses[-1] < losses[0] / 2
    scale = scaler.get_scale()
    assert scale > 1
    before = [p.detach().clone() for p in model.parameters()]
    result = strategy.training_step(model, torch.randn(4, 8, device="cuda"))
    assert isinstance(result, torch.Tensor)
    strategy.backward(result.float().sum() * float("inf"), model)
    strategy.optimizer_step(optimizer)

    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() == scale * scaler.get_backoff_factor()


def test_bf16_mixed_computes_in_bfloat16_and_keeps_float32_parameters() -> None:
    strategy = SingleDeviceStrategy("cuda", precision="bf16-mixed")
    model, _, losses, output = _train(strategy, 30)
    precision = strategy.precision
    assert isinstance(precision, MixedPrecision)

    assert precision.scaler is None
    assert output.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 and p.is_cuda for p in model.parameters())
    assert losses[-1] < losses[0] / 2


def test_ddp_at_world_size_1_on_nccl_and_two_ranks_sharing_the_gpu_over_gloo_agree(
    tmp_path: Path, start_ranks: StartRanks
) -> None:
    script = HERE / "shared_gpu.py"
    start_ranks(script, ["nccl", str(tmp_path / "nccl.json")], 1, timeout=180)
    start_ranks(script, ["gloo", str(tmp_path / "gloo.json")], 2, timeout=180)
    one, two = (json.loads((tmp_path / f"{b}.json").read_text()) for b in ("nccl", "gloo"))

    assert one["backend"] == "nccl"
    assert two["backend"] == "gloo"
    assert one["devices"] == two["devices"] == ["cuda:0"]
    # Two halves of each batch, their gradients averaged: one batch on one rank.
    for key, value in one["weights"].items():
        torch.testing.assert_close(
            torch.tensor(two["weights"][key]), torch.tensor(value), rtol=1e-5, atol=1e-6
        )


def test_fsdp_in_bf16_on_the_gpu_trains_as_in_float32(tmp_path: Path) -> None:
    common = ("--accelerator", "cuda", "--devices", "1", "--epochs", "1")
    job = TESTS / "fsdp_job.py"
    fp32 = run_job(job, tmp_path / "fp32", "fp32", *common)
    bf16 = run_job(job, tmp_path / "bf16", "bf16", *common, "--precision", "bf16-mixed",
                   "--options", '{"wrap": "blocks"}')  # fmt: skip

    assert bf16["dtypes"] == ["torch.bfloat16"]
    assert_losses_close(losses_of(bf16), losses_of(fp32), 2e-2)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_on_the_gpu_trains_as_ddp_does(tmp_path: Path, stage: int) -> None:
    # One rank on NCCL. DeepSpeed builds none of its ops here: the strategy uses
    # torch's optimizers, so no compiler is asked for.
    common = ("--accelerator", "cuda", "--devices", "1", "--epochs", "2")
    job = TESTS / "deepspeed_job.py"
    ddp = run_job(job, tmp_path / "ddp", "ddp", "--strategy", "ddp", *common)
    zero = run_job(job, tmp_path / "zero", "zero", "--strategy", "deepspeed", *common,
                   "--options", json.dumps({"stage": stage}))  # fmt: skip

    assert_losses_close(losses_of(zero), losses_of(ddp), 1e-4)
    exported, expected = (
        final_weights(tmp_path / "zero", "zero"),
        final_weights(tmp_path / "ddp", "ddp"),
    )
    for key, value in exported.items():
        torch.testing.assert_close(value, expected[key], rtol=1e-4, atol=1e-5)
    extensions = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    assert not list(extensions.glob("**/*.so")) if extensions.exists() else True


def test_a_deterministic_run_on_the_gpu_trains_and_repeats_itself_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cuBLAS refuses deterministic matrix products without CUBLAS_WORKSPACE_CONFIG:
    # Trainer(deterministic=True) sets it, so the first Linear does not raise.
    from torch.utils.data import DataLoader, TensorDataset  # noqa: PLC0415

    from plait.trainer import Module, Trainer  # noqa: PLC0415

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)

    class Net(Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(
                torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
            )

        @override
        def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
            assert isinstance(batch, list)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layers(x), y)

        @override
        def configure_optimizers(self) -> object:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    def fit() -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        model = Net()
        trainer = Trainer(
            accelerator="cuda",
            devices=1,
            deterministic=True,
            max_epochs=2,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            default_root_dir=tmp_path,
        )
        trainer.fit(model, DataLoader(data, batch_size=8))
        return {key: value.detach().cpu() for key, value in model.state_dict().items()}

    try:
        first, second = fit(), fit()
    finally:
        torch.use_deterministic_algorithms(mode=False)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert all(torch.equal(first[key], second[key]) for key in first)


def test_context_parallel_attention_on_nccl_is_scaled_dot_product_attention() -> None:
    # A one-rank NCCL group: the all-gather's backward is NCCL's reduce-scatter (gloo
    # has none), and the mask is made from the tokens' positions on the GPU.
    import torch.distributed as dist  # noqa: PLC0415

    from plait.strategies.context_parallel import context_parallel_attention  # noqa: PLC0415

    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        generator = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, grad = (
            torch.randn(2, 4, 16, 8, device="cuda", generator=generator) for _ in range(4)
        )
        mine = [t.clone().requires_grad_() for t in (q, k, v)]
        whole = [t.clone().requires_grad_() for t in (q, k, v)]
        out = context_parallel_attention(
            mine[0], mine[1], mine[2], group=dist.group.WORLD, positions=torch.arange(16),
            is_causal=True,
        )  # fmt: skip
        expected = torch.nn.functional.scaled_dot_product_attention(
            whole[0], whole[1], whole[2], is_causal=True
        )
        out.backward(grad)  # type: ignore[no-untyped-call]
        expected.backward(grad)  # type: ignore[no-untyped-call]
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        for part, reference in zip(mine, whole, strict=True):
            assert part.grad is not None
            assert reference.grad is not None
            torch.testing.assert_close(part.grad, reference.grad, rtol=1e-4, atol=1e-4)
    finally:
        dist.destroy_process_group()


def test_a_pipeline_on_the_gpu_trains_as_the_whole_model_does() -> None:
    # Every stage on one rank (GPipe, 4 microbatches) on the GPU: the same steps as
    # the whole model's.
    from torch import nn  # noqa: PLC0415

    from plait.strategies import ModelParallelStrategy  # noqa: PLC0415

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleDict({str(i): nn.Linear(16, 16) for i in range(4)})

        @override
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            for layer in self.layers.values():
                if layer is not None:
                    h = torch.tanh(layer(h))
            return h

    strategy = ModelParallelStrategy(accelerator="cuda", pipeline_schedule="GPipe")
    strategy.setup_environment()
    try:
        torch.manual_seed(0)
        whole = Stack().cuda()
        units = [f"layers.{i}" for i in range(4)]
        pipeline = strategy.pipeline(whole, nn.functional.mse_loss, units=units, microbatches=4)
        strategy.setup_module(pipeline)
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (pipeline, whole)]
        x, y = torch.randn(8, 16, device="cuda"), torch.randn(8, 16, device="cuda")
        for _ in range(3):
            loss = pipeline.step(x, target=y)
            expected = nn.functional.mse_loss(whole(x), y)
            expected.backward()  # type: ignore[no-untyped-call]
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
            assert float(loss) == pytest.approx(float(expected.detach()), rel=1e-4)
    finally:
        strategy.teardown()
