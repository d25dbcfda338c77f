"""Context parallelism in one process: which tokens a rank holds, the mesh's numbering,
and attention with no group (the same call a context-parallel module makes).

The attention over real cp groups is checked on gloo in ``tests/test_model_parallel.py``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from plait.core import ConfigurationError
from plait.strategies.context_parallel import (
    context_parallel_attention,
    sequence_positions,
    shard_sequence,
)
from plait.strategies.model_parallel import FLATTENED_DIMENSIONS, MESH_DIMENSIONS, MeshShape


@given(size=st.integers(1, 6), chunk=st.integers(1, 5), balanced=st.booleans())
def test_the_ranks_of_a_cp_group_hold_every_position_once(
    size: int, chunk: int, balanced: bool
) -> None:
    length = chunk * size * (2 if balanced else 1)
    held = [
        sequence_positions(length, rank=rank, size=size, load_balanced=balanced)
        for rank in range(size)
    ]
    assert sorted(torch.cat(held).tolist()) == list(range(length))
    for positions in held:
        assert positions.dtype == torch.int64
        assert len(positions) == length // size
        assert positions.tolist() == sorted(positions.tolist())
    if balanced:
        # Chunks r and 2W-1-r: every rank's positions sum alike (as much causal work).
        assert len({int(positions.sum()) for positions in held}) == 1


def test_shard_sequence_takes_the_positions_along_the_dimension() -> None:
    tensor = torch.arange(2 * 8).view(2, 8)
    assert shard_sequence(tensor, rank=1, size=2).tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    assert shard_sequence(tensor, rank=1, size=2, load_balanced=False).tolist() == [
        [4, 5, 6, 7],
        [12, 13, 14, 15],
    ]
    assert torch.equal(shard_sequence(tensor, rank=0, size=1), tensor)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sequence_positions(6, rank=0, size=2), "length 6 does not split into 4 equal"),
        (
            lambda: sequence_positions(5, rank=0, size=2, load_balanced=False),
            "length 5 does not split into 2 equal contiguous slices",
        ),
        (lambda: sequence_positions(0, rank=0, size=1), "length 0 does not split"),
        (lambda: sequence_positions(8, rank=2, size=2), r"rank 2 is outside \[0, 2\)"),
        (lambda: sequence_positions(8, rank=0, size=0), "size of 0 is not an int >= 1"),
        (lambda: sequence_positions(8, rank=True, size=2), "rank of True is not an int"),
        (lambda: shard_sequence(torch.zeros(4), rank=0, size=1, dim=1), "dim=1 is not a dim"),
    ],
)
def test_bad_slices_are_refused_naming_the_value(call: object, message: str) -> None:
    assert callable(call)
    with pytest.raises(ConfigurationError, match=message):
        call()


def test_without_a_group_it_is_scaled_dot_product_attention() -> None:
    q, k, v = torch.randn(3, 2, 2, 6, 4, dtype=torch.float64).unbind(0)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for causal in (True, False):
        expected = sdpa(q, k, v, is_causal=causal)
        # With the positions of the whole sequence too (what one rank of cp = 1 passes).
        for positions in (None, torch.arange(6)):
            out = context_parallel_attention(
                q, k, v, group=None, positions=positions, is_causal=causal
            )
            torch.testing.assert_close(out, expected)


def test_tokens_and_positions_that_do_not_match_are_refused() -> None:
    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ConfigurationError, match="different numbers of tokens"):
        context_parallel_attention(q, torch.zeros(1, 1, 3, 2), q, group=None)
    with pytest.raises(ConfigurationError, match=r"positions of shape \(8,\) for 4 tokens"):
        context_parallel_attention(q, q, q, group=None, positions=torch.arange(8))


@given(
    sizes=st.tuples(*(st.integers(1, 3) for _ in MESH_DIMENSIONS)),
    data=st.data(),
)
def test_a_rank_s_coordinates_are_its_places_in_the_groups_that_hold_it(
    sizes: tuple[int, int, int, int, int], data: st.DataObject
) -> None:
    pipeline, replicate, shard, context, tensor = sizes
    shape = MeshShape(
        replicate=replicate, shard=shard, tensor=tensor, context=context, pipeline=pipeline
    )
    rank = data.draw(st.integers(0, shape.world_size - 1))
    where = shape.coordinates(rank)
    for name in (*MESH_DIMENSIONS, *FLATTENED_DIMENSIONS):
        dimensions = FLATTENED_DIMENSIONS.get(name, (name,))
        lines = shape.lines(dimensions).tolist()
        assert sorted(r for line in lines for r in line) == list(range(shape.world_size))
        [line] = [line for line in lines if rank in line]
        assert line.index(rank) == where[name], name
    if context == 1 and pipeline == 1:
        # Without cp and pp, the numbering over (dp_replicate, dp_shard, tp) it always
        # had, and the flattened groups with cp are the ones without.
        assert (where["dp"], where["tp"]) == divmod(rank, tensor)
        assert (where["dp_shard_cp"], where["dp_cp"]) == (where["dp_shard"], where["dp"])
