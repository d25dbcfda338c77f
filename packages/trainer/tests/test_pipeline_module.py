"""``Module.pipeline`` in one process: the network whole under its own names, refusals
of a declaration no split could run, and a pipeline's loss under the Trainer.

The decoder cut into stages over pp ranks runs in ``tests/test_cli.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import ConfigurationError, SupportsAccumulation, SupportsPipeline
from plait.strategies import DDPStrategy, ModelParallelStrategy
from plait.strategies.pipeline import WholePipeline
from plait.trainer import Module, Trainer
from plait.trainer.examples.decoder import Decoder, DecoderLM

if TYPE_CHECKING:
    from pathlib import Path


def _whole(module: Module) -> WholePipeline:
    assert isinstance(module, DecoderLM)
    network = module.model
    assert isinstance(network, Decoder)
    pipeline = module.pipeline(network, nn.functional.mse_loss, units=network.units())
    assert isinstance(pipeline, WholePipeline)
    return pipeline


def test_without_pipeline_ranks_the_network_stays_whole_under_its_own_names() -> None:
    module = DecoderLM()
    network = module.model
    pipeline = _whole(module)
    # The same tensors under the same names: a checkpoint of one loads into the other.
    assert pipeline.state_dict().keys() == network.state_dict().keys()
    assert all(
        mine is theirs
        for mine, theirs in zip(pipeline.parameters(), network.parameters(), strict=True)
    )
    assert pipeline.parts == (network,)
    tokens = torch.randint(32, (2, 16))
    target = torch.randn(2, 16, 32)
    positions = torch.arange(16)
    expected = nn.functional.mse_loss(network(tokens, positions), target)
    loss = pipeline(tokens, target=target, positions=positions)
    assert torch.equal(loss, expected)
    assert loss.requires_grad  # a loss like any other: the caller back-propagates it
    pipeline.eval()
    assert not network.training
    with pytest.raises(ConfigurationError, match="no target was given"):
        pipeline(tokens, positions=positions)
    # A later run of the job finds it made already.
    assert module.pipeline(pipeline, nn.functional.mse_loss, units=["tokens"]) is pipeline


def test_a_declaration_no_split_could_run_is_refused_in_one_process_too() -> None:
    module = DecoderLM()
    network = module.model
    assert isinstance(network, Decoder)
    # A stage list that misses a layer: refused before any pipeline runs.
    units = [unit for unit in network.units() if unit != "blocks.1"]
    with pytest.raises(ConfigurationError, match=r"leave out 12 of Decoder's tensors"):
        module.pipeline(network, nn.functional.mse_loss, units=units)
    with pytest.raises(ConfigurationError, match="by its stages or by its units"):
        module.pipeline(network, nn.functional.mse_loss)


def test_the_model_parallel_strategy_is_one_that_pipelines() -> None:
    strategy = ModelParallelStrategy(accelerator="cpu")
    assert isinstance(strategy, SupportsPipeline)
    assert strategy.pipeline_parallel_size == 1


def test_the_trainer_tells_the_accumulation_to_a_strategy_that_asks_for_it() -> None:
    # The Trainer imports no strategy family: a pipeline's scaling by the batches
    # accumulated goes through plait.core.SupportsAccumulation.
    strategy = ModelParallelStrategy(accelerator="cpu")
    assert isinstance(strategy, SupportsAccumulation)
    assert not isinstance(DDPStrategy(accelerator="cpu"), SupportsAccumulation)
    with pytest.raises(ConfigurationError, match=r"accumulate\(batches=0\).*positive int"):
        strategy.accumulate(nn.Linear(2, 2), 0)
    strategy.accumulate(nn.Linear(2, 2), 4)  # no pipeline in it: nothing to scale


class _Stack(Module):
    """A stack whose training goes through a pipeline of every stage on one rank."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): nn.Linear(4, 4) for i in range(3)})
        self.network: nn.Module = _Network(self.layers)
        self.seen: list[float] = []

    @override
    def configure_model(self) -> None:
        from plait.strategies.pipeline import Pipeline  # noqa: PLC0415

        strategy = self.trainer.strategy
        assert isinstance(strategy, ModelParallelStrategy)
        if not isinstance(self.network, Pipeline):
            self.network = strategy.pipeline(
                self.network,
                nn.functional.mse_loss,
                units=[f"layers.{i}" for i in range(3)],
                schedule="GPipe",
                microbatches=2,
            )

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        loss: torch.Tensor = self.network(x, target=y)
        self.seen.append(float(loss.detach()))
        return loss

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.network.parameters(), lr=0.1)


class _Network(nn.Module):
    def __init__(self, layers: nn.ModuleDict) -> None:
        super().__init__()
        self.layers = layers

    @override
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            if layer is not None:
                h = torch.tanh(layer(h))
        return h


@pytest.mark.parametrize("accumulate", [1, 2])
def test_under_the_trainer_a_pipeline_s_loss_is_not_back_propagated_twice(
    tmp_path: Path, accumulate: int
) -> None:
    # The schedule ran the backward already; the Trainer's own backward from the
    # loss it returns must add nothing, and accumulation must divide the gradients
    # as it divides a loss: the weights are those of plain SGD on the same batches.
    torch.manual_seed(0)
    module = _Stack()
    plain = _Network(nn.ModuleDict({k: nn.Linear(4, 4) for k in ("0", "1", "2")}))
    plain.load_state_dict(module.network.state_dict())
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(16, 4, generator=generator), torch.randn(16, 4))
    trainer = Trainer(
        strategy=ModelParallelStrategy(accelerator="cpu"),
        max_epochs=1,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, DataLoader(data, batch_size=4))
    optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
    for index, (x, y) in enumerate(DataLoader(data, batch_size=4)):
        (nn.functional.mse_loss(plain(x), y) / accumulate).backward()  # type: ignore[no-untyped-call]
        if (index + 1) % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
    from plait.strategies.pipeline import Pipeline  # noqa: PLC0415

    pipeline = module.network
    assert isinstance(pipeline, Pipeline)
    [part] = pipeline.parts  # GPipe on one rank: one stage, the whole network
    trained = part.state_dict()
    for name, value in plain.state_dict().items():
        assert torch.allclose(trained[name], value, atol=1e-6), name
    assert len(module.seen) == 4
