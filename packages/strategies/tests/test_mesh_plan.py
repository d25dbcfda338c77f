"""The mesh plan: sizes checked once when made, laid out by one pure function of the world.

No process group and no environment: `MeshSizes.resolve` is given the world's size
and nodes, as the strategy gives it once when it joins its job.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from plait.core import ConfigurationError
from plait.strategies import ModelParallelStrategy
from plait.strategies.mesh_plan import (
    FLATTENED_DIMENSIONS,
    MESH_DIMENSIONS,
    MeshDim,
    MeshShape,
    MeshSizes,
)


def test_each_dimension_is_the_name_it_goes_by_in_groups_meshes_and_messages() -> None:
    assert [str(name) for name in MESH_DIMENSIONS] == ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    assert MeshDim("tp") is MeshDim.TENSOR
    assert isinstance(MeshDim.TENSOR, str)
    assert {"tp": 1}[MeshDim.TENSOR] == 1
    assert repr([MeshDim.SHARD, MeshDim.DATA_CONTEXT]) == "['dp_shard', 'dp_cp']"
    assert f"{MeshDim.CONTEXT}" == "cp"
    assert json.dumps({MeshDim.PIPELINE: 2}) == '{"pp": 2}'
    assert FLATTENED_DIMENSIONS[MeshDim.DATA] == (MeshDim.REPLICATE, MeshDim.SHARD)


@pytest.mark.parametrize(
    ("sizes", "world", "nodes", "expected"),
    [
        ({}, 1, 1, MeshShape(replicate=1, shard=1, tensor=1)),
        # Both 'auto': data parallel over the nodes, tensor parallel within each.
        ({}, 8, 2, MeshShape(replicate=1, shard=2, tensor=4)),
        ({}, 6, 4, MeshShape(replicate=1, shard=1, tensor=6)),  # 4 nodes do not divide 6
        ({"tensor_parallel_size": 2}, 8, 1, MeshShape(replicate=1, shard=4, tensor=2)),
        ({"data_parallel_size": 2}, 8, 1, MeshShape(replicate=1, shard=2, tensor=4)),
        (
            {"data_parallel_size": 4, "data_parallel_replicate_size": 2},
            8,
            1,
            MeshShape(replicate=2, shard=2, tensor=2),
        ),
        ({"context_parallel_size": 2}, 8, 1, MeshShape(replicate=1, shard=1, tensor=4, context=2)),
        # A pipeline size alone: the rest goes to tensor parallelism, as it always has.
        (
            {"pipeline_parallel_size": 2},
            4,
            1,
            MeshShape(replicate=1, shard=1, tensor=2, pipeline=2),
        ),
        (
            {"pipeline_parallel_size": 2, "context_parallel_size": 2, "tensor_parallel_size": 1},
            8,
            1,
            MeshShape(replicate=1, shard=2, tensor=1, context=2, pipeline=2),
        ),
    ],
)
def test_sizes_resolve_against_a_world_of_ranks_and_nodes(
    sizes: dict[str, int], world: int, nodes: int, expected: MeshShape
) -> None:
    shape = MeshSizes(**sizes).resolve(world, nodes)
    assert shape == expected
    assert shape.world_size == world


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"data_parallel_size": 0}, "data_parallel_size=0 is neither a positive int nor 'auto'"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size=True is neither"),
        ({"data_parallel_replicate_size": "auto"}, "data_parallel_replicate_size takes a positive"),
        ({"context_parallel_size": "auto"}, "context_parallel_size takes a positive int"),
        ({"pipeline_parallel_size": "auto"}, "pipeline_parallel_size takes a positive int"),
        (
            {"data_parallel_size": 4, "data_parallel_replicate_size": 3},
            "data_parallel_replicate_size=3 does not divide data_parallel_size=4",
        ),
    ],
)
def test_sizes_that_cannot_make_any_world_are_refused_when_made(
    sizes: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        MeshSizes(**sizes)  # type: ignore[arg-type]
    assert "fix:" in str(caught.value)


@pytest.mark.parametrize(
    ("sizes", "world", "message", "fix"),
    [
        (
            {"tensor_parallel_size": 3},
            4,
            "tensor_parallel_size=3 does not divide the world of 4",
            "pass a tensor_parallel_size that divides 4",
        ),
        (
            {"data_parallel_size": 2, "tensor_parallel_size": 3},
            4,
            "data_parallel_size=2 x tensor_parallel_size=3 is 6 ranks, and the world has 4",
            "give sizes whose product is 4",
        ),
        (
            {"context_parallel_size": 3},
            4,
            "context_parallel_size=3 does not divide the world of 4",
            "pass a context_parallel_size that divides 4",
        ),
        (
            {"tensor_parallel_size": 2, "data_parallel_replicate_size": 2},
            2,
            "data_parallel_replicate_size=2 does not divide the data-parallel size 1",
            "pass a replica count that divides 1",
        ),
    ],
)
def test_sizes_that_do_not_make_the_world_are_refused_naming_it(
    sizes: dict[str, int], world: int, message: str, fix: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        MeshSizes(**sizes).resolve(world)
    assert fix in str(caught.value)


@given(
    pipeline=st.sampled_from([1, 2]),
    replicate=st.sampled_from([1, 2]),
    shard=st.sampled_from([1, 2, 3]),
    context=st.sampled_from([1, 2]),
    tensor=st.sampled_from([1, 2]),
)
def test_every_rank_lies_on_one_line_of_each_dimension_at_its_coordinates(
    pipeline: int, replicate: int, shard: int, context: int, tensor: int
) -> None:
    shape = MeshSizes(
        data_parallel_size=replicate * shard,
        tensor_parallel_size=tensor,
        data_parallel_replicate_size=replicate,
        context_parallel_size=context,
        pipeline_parallel_size=pipeline,
    ).resolve(pipeline * replicate * shard * context * tensor)
    for rank in range(shape.world_size):
        where = shape.coordinates(rank)
        for name in (*MESH_DIMENSIONS, *FLATTENED_DIMENSIONS):
            line = shape.line(FLATTENED_DIMENSIONS.get(name, (name,)), rank)
            assert line.index(rank) == where[name], (rank, name)
            assert shape.enabled(name) == (len(line) > 1)


def test_a_strategy_answers_the_mesh_of_the_ranks_it_launches_in_the_launching_process() -> None:
    # fit under spawn or fork: this process is not a rank, its world is of one; it
    # answers the job's mesh as its ranks do, and lays out its own one process.
    strategy = ModelParallelStrategy(
        accelerator="cpu",
        parallel_devices=[torch.device("cpu")] * 4,
        tensor_parallel_size=2,
        start_method="fork",
    )
    assert strategy.world_size == 1
    assert strategy.mesh_shape == MeshShape(replicate=1, shard=2, tensor=2)
    assert strategy.layout.data_parallel_size == 1
    refused = ModelParallelStrategy(
        accelerator="cpu", parallel_devices=[torch.device("cpu")] * 4, tensor_parallel_size=3
    )
    with pytest.raises(ConfigurationError, match="does not divide the world of 4"):
        _ = refused.mesh_shape
