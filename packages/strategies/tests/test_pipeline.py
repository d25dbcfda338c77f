"""Pipeline stages: how a module is declared and split, what is refused, and pipelines in
one process (every stage on one rank) against the whole module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from typing_extensions import override

from plait.core import ConfigurationError
from plait.strategies import ModelParallelStrategy
from plait.strategies.mesh_plan import MeshSizes
from plait.strategies.pipeline import (
    SCHEDULES,
    schedule_name,
    split_module,
    split_units,
    stage_indices,
    stage_owner,
    stages_per_rank,
)

UNITS: Final = ("embed", "layers.0", "layers.1", "layers.2", "head")


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed: nn.Module | None = nn.Linear(3, 6)
        self.layers = nn.ModuleDict({str(i): nn.Linear(6, 6) for i in range(3)})
        self.head: nn.Module | None = nn.Linear(6, 1)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            if layer is not None:
                h = torch.tanh(layer(h))
        return self.head(h) if self.head is not None else h


def _split(stages: list[list[str]] | None = None, **options: object) -> list[nn.Module]:
    parts, _, _ = split_module(
        Stack(),
        stages=stages,
        units=None if stages is not None else UNITS,
        schedule=str(options.get("schedule", "1F1B")),
        per_rank=int(options.get("per_rank", 1)),  # type: ignore[call-overload]
        rank=int(options.get("rank", 0)),  # type: ignore[call-overload]
        size=int(options.get("size", 2)),  # type: ignore[call-overload]
    )
    return parts


def test_a_stage_keeps_the_whole_module_s_names_and_none_for_the_others() -> None:
    first, second = (_split(rank=rank)[0] for rank in (0, 1))
    assert [name for name, _ in first.named_parameters()] == [
        "embed.weight", "embed.bias", "layers.0.weight", "layers.0.bias",
    ]  # fmt: skip
    assert isinstance(second, Stack)
    assert second.embed is None
    assert next(name for name, _ in second.named_parameters()) == "layers.1.weight"
    assert {n for n, _ in first.named_parameters()} | {n for n, _ in second.named_parameters()} == {
        n for n, _ in Stack().named_parameters()
    }


def test_stages_that_miss_a_layer_repeat_one_or_name_no_submodule_are_refused() -> None:
    # The broken control: a stage list that misses a layer would train without it.
    with pytest.raises(ConfigurationError, match=r"leave out 2 of Stack's tensors \(layers.1"):
        _split([["embed", "layers.0"], ["layers.2", "head"]])
    with pytest.raises(ConfigurationError, match=r"name \['layers.0'\] more than once"):
        _split([["embed", "layers.0"], ["layers.0", "layers.1", "layers.2", "head"]])
    with pytest.raises(ConfigurationError, match=r"inside layers"):
        _split([["embed", "layers"], ["layers.1", "head"]])
    with pytest.raises(ConfigurationError, match=r"\['layer.1'\] which are not submodules"):
        _split([["embed", "layers.0", "layers.2"], ["layer.1", "head"]])
    with pytest.raises(ConfigurationError, match="3 pipeline stages given, and 2 pipeline ranks"):
        _split([["embed"], ["layers.0", "layers.1"], ["layers.2", "head"]])
    with pytest.raises(ConfigurationError, match="5 pipeline units cannot fill 6 stages"):
        _split(schedule="Interleaved1F1B", per_rank=3)


@given(count=st.integers(1, 12), stages=st.integers(1, 12))
def test_units_split_into_consecutive_stages_as_even_as_they_go(count: int, stages: int) -> None:
    units = [f"u{i}" for i in range(count)]
    if count < stages:
        with pytest.raises(ConfigurationError, match="cannot fill"):
            split_units(units, stages)
        return
    split = split_units(units, stages)
    assert [unit for stage in split for unit in stage] == units
    assert max(map(len, split)) - min(map(len, split)) <= 1


@given(size=st.integers(1, 6), data=st.data())
def test_every_stage_is_held_by_one_rank_and_the_owner_is_that_rank(
    size: int, data: st.DataObject
) -> None:
    schedule = data.draw(st.sampled_from(SCHEDULES))
    per_rank = stages_per_rank(schedule) if schedule not in {"LoopedBFS"} else 3
    held = {rank: stage_indices(schedule, rank, size, per_rank) for rank in range(size)}
    stages = sorted(stage for mine in held.values() for stage in mine)
    assert stages == list(range(size * per_rank))
    for rank, mine in held.items():
        assert all(stage_owner(schedule, stage, size) == rank for stage in mine)
        assert list(mine) == sorted(mine) or schedule in {"ZBVZeroBubble", "DualPipeV"}


def test_schedules_stage_counts_and_microbatches_are_checked_with_the_choices() -> None:
    assert schedule_name("interleaved1f1b") == "Interleaved1F1B"
    with pytest.raises(ConfigurationError, match="'1f1b-v' is not one of torch's") as caught:
        schedule_name("1f1b-v")
    assert "GPipe" in caught.value.choices
    with pytest.raises(ConfigurationError, match="1F1B schedule runs exactly 1 stages"):
        stages_per_rank("1F1B", 2)
    with pytest.raises(ConfigurationError, match=r"exactly 2 \(stages r and 2\*pp-1-r\)"):
        stages_per_rank("DualPipeV", 3)
    with pytest.raises(ConfigurationError, match="runs 2 or more stages per rank, not 1"):
        stages_per_rank("LoopedBFS", 1)
    with pytest.raises(ConfigurationError, match="pipeline_parallel_size takes a positive int"):
        ModelParallelStrategy(pipeline_parallel_size="auto")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="'zero-bubble' is not one of torch's"):
        ModelParallelStrategy(pipeline_schedule="zero-bubble")
    with pytest.raises(ConfigurationError, match="pipeline_microbatches=0 is neither"):
        ModelParallelStrategy(pipeline_microbatches=0)


@pytest.fixture
def strategy() -> Iterator[ModelParallelStrategy]:
    made = ModelParallelStrategy(accelerator="cpu")
    made.setup_environment()
    yield made
    made.teardown()


@pytest.mark.parametrize(("schedule", "microbatches"), [("GPipe", 4), ("Interleaved1F1B", 2)])
def test_a_pipeline_on_one_rank_trains_as_the_whole_module_does(
    strategy: ModelParallelStrategy, schedule: str, microbatches: int
) -> None:
    # Every stage on one rank, the batch in microbatches: the gradients of the
    # batch's mean loss, so the same steps as the whole module's.
    torch.manual_seed(0)
    whole = Stack()
    pipeline = strategy.pipeline(
        whole, nn.functional.mse_loss, units=UNITS, schedule=schedule, microbatches=microbatches
    )
    assert pipeline.stages == ((0,) if schedule == "GPipe" else (0, 1))
    strategy.setup_module(pipeline)
    pipelined = torch.optim.SGD(pipeline.parameters(), lr=0.1)
    plain = torch.optim.SGD(whole.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 3, generator=generator), torch.randn(8, 1, generator=generator)
        loss = pipeline.step(x, target=y)
        expected = nn.functional.mse_loss(whole(x), y)
        expected.backward()  # type: ignore[no-untyped-call]
        for optimizer in (pipelined, plain):
            optimizer.step()
            optimizer.zero_grad()
        assert float(loss) == pytest.approx(float(expected.detach()), abs=1e-6)
    state = strategy.get_state_dict(pipeline)["state_dict"]
    assert isinstance(state, dict)
    for name, value in whole.state_dict().items():
        assert torch.allclose(state[name], value, atol=1e-6), name
    x, y = torch.randn(8, 3, generator=generator), torch.randn(8, 1, generator=generator)
    assert float(pipeline.evaluate(x, target=y)) == pytest.approx(
        float(nn.functional.mse_loss(whole(x), y).detach()), abs=1e-6
    )


def test_a_batch_that_does_not_split_and_a_missing_target_are_refused(
    strategy: ModelParallelStrategy,
) -> None:
    pipeline = strategy.pipeline(Stack(), nn.functional.mse_loss, units=UNITS, microbatches=3)
    with pytest.raises(ConfigurationError, match="a batch of 8 does not split into 3 equal"):
        pipeline.step(torch.zeros(8, 3), target=torch.zeros(8, 1))
    with pytest.raises(ConfigurationError, match="no target was given"):
        pipeline.step(torch.zeros(6, 3))
    with pytest.raises(ConfigurationError, match="by its stages or by its units, one of the two"):
        strategy.pipeline(Stack(), nn.functional.mse_loss)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (
            {"pipeline_parallel_size": 2, "context_parallel_size": 2},
            "pipeline_parallel_size=2 x context_parallel_size=2 does not divide the world of 6",
        ),
        ({"pipeline_parallel_size": 4}, "pipeline_parallel_size=4 does not divide the world of 6"),
        (
            {"pipeline_parallel_size": 2, "tensor_parallel_size": 2},
            "does not divide the 3 ranks a pipeline_parallel_size of 2 leaves",
        ),
        (
            {"pipeline_parallel_size": 2, "data_parallel_size": 2, "tensor_parallel_size": 2},
            "pipeline_parallel_size=2 x data_parallel_size=2 x tensor_parallel_size=2 is 8 ranks",
        ),
    ],
)
def test_pipeline_sizes_that_do_not_make_the_world_are_refused_naming_them(
    sizes: dict[str, int], message: str
) -> None:
    # A job of 6 ranks: the sizes as the strategy checks them, resolved against it.
    checked = MeshSizes(**sizes)
    with pytest.raises(ConfigurationError, match=message):
        checked.resolve(world_size=6)
    fitting = MeshSizes(pipeline_parallel_size=3).resolve(world_size=6)
    assert fitting.sizes == {"pp": 3, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 2}
