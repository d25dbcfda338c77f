"""Mesh lanes without processes: the layout's groups, the declarations and their errors."""

from __future__ import annotations

from typing import ClassVar

import pytest

from plait.conformance import (
    BadArgumentCase,
    Case,
    ConformanceSuite,
    ReduceCase,
    StrategyTarget,
    TensorSpec,
)
from plait.conformance.mesh import MeshLayout
from plait.conformance.options import parse_meshes as _meshes
from plait.conformance.outcomes import Outcome, RaisedError
from plait.conformance.plugin import Lane, _declared_meshes
from plait.conformance.pool import GroupOutcomes, MeshDimension, RankPool, _renumbered
from plait.core import ConfigurationError, Strategy, StrategyRegistry

LAYOUT = MeshLayout(("dp_replicate", "dp_shard", "tp"), (1, 2, 2), (0, 1, 2, 3))


def test_the_groups_along_each_dimension_are_the_ranks_that_differ_only_there() -> None:
    assert LAYOUT.groups("tp") == ((0, 1), (2, 3))
    assert LAYOUT.groups("dp_shard") == ((0, 2), (1, 3))
    assert LAYOUT.groups("dp_replicate") == ((0,), (1,), (2,), (3,))
    assert LAYOUT.group_of("dp_shard", 3) == (1, 3)
    assert LAYOUT.describe() == "dp_replicate=1 x dp_shard=2 x tp=2"
    # A mesh whose ranks are not in order: the groups follow the mesh, not the numbers.
    shuffled = MeshLayout(("a", "b"), (2, 3), (5, 4, 3, 2, 1, 0))
    assert shuffled.groups("a") == ((5, 2), (4, 1), (3, 0))
    assert shuffled.groups("b") == ((5, 4, 3), (2, 1, 0))


def test_a_dimension_the_mesh_lacks_is_refused_with_the_names_it_has() -> None:
    with pytest.raises(ConfigurationError, match="'pp'") as caught:
        LAYOUT.groups("pp")
    assert "dp_replicate" in str(caught.value)
    assert "tp" in str(caught.value)


def test_errors_naming_global_ranks_are_read_as_places_in_the_group() -> None:
    error = RaisedError(
        "CollectiveMismatchError",
        frozenset({"CollectiveMismatchError"}),
        "",
        "",
        calls=((2, "reduce"), (3, "all_gather")),
    )
    timeout = RaisedError(
        "CollectiveTimeoutError", frozenset({"CollectiveTimeoutError"}), "", "", missing_ranks=(3,)
    )
    assert _renumbered(Outcome(0, error=error), (2, 3)).error == RaisedError(
        "CollectiveMismatchError",
        frozenset({"CollectiveMismatchError"}),
        "",
        "",
        calls=((0, "reduce"), (1, "all_gather")),
    )
    renumbered = _renumbered(Outcome(0, error=timeout), (2, 3)).error
    assert renumbered is not None
    assert renumbered.missing_ranks == (1,)
    # A rank outside the group keeps its number: the check then says it is no member.
    outside = _renumbered(Outcome(0, error=timeout), (0, 1)).error
    assert outside is not None
    assert outside.missing_ranks == (3,)


def test_a_group_names_itself_in_each_problem_and_the_world_does_not() -> None:
    over_tp = GroupOutcomes((2, 3), [], (), "tp")
    assert over_tp.named("rank 1: wrong") == (
        "rank 1: wrong [over 'tp', in the group of global ranks [2, 3]]"
    )
    assert GroupOutcomes((0, 1), [], ()).named("rank 1: wrong") == "rank 1: wrong"


def _src_sent(lane: MeshDimension, src: int) -> object:
    prepared = lane.prepare(BadArgumentCase("broadcast", "src", src, "ValueError"))
    assert isinstance(prepared, BadArgumentCase)
    return prepared.value


def test_a_bad_src_is_made_one_outside_the_job_and_other_examples_are_kept() -> None:
    pool = RankPool("ddp", world_size=4, mesh=(2, 2))
    pool.layout = LAYOUT  # as the ranks would report it; none is started here
    lane = MeshDimension(pool, "tp")
    assert lane.world_size == 2
    # src=2 is outside the group [0, 1] but inside [2, 3]: past the job, it is outside both.
    assert _src_sent(lane, 2) == 4
    assert _src_sent(lane, 3) == 5
    kept: list[Case] = [
        BadArgumentCase("broadcast", "src", -1, "ValueError"),
        BadArgumentCase("broadcast", "src", 2**31, "ValueError"),
        ReduceCase("sum", (TensorSpec("int64", (1,), (1,)),) * 2),
    ]
    assert [lane.prepare(case) for case in kept] == kept
    prepared = lane.prepare(BadArgumentCase("broadcast", "src", 2, "ValueError"))
    assert lane.prepare(prepared) == prepared  # once is enough: a rerun gives the same
    assert lane.rerun == {"world_size": 4, "backend": "gloo", "mesh": (2, 2), "dimension": "tp"}
    assert lane.where == "gloo, world size 4, mesh 2x2, over 'tp': groups [0, 1] and [2, 3]"


def test_a_pool_without_a_mesh_has_no_dimensions_and_refuses_one() -> None:
    pool = RankPool("ddp", world_size=2)
    assert pool.dimensions == ()
    with pytest.raises(ConfigurationError, match="made without a mesh"):
        pool.along("tp")


def test_a_mesh_target_needs_positive_sizes_and_a_factory_taking_mesh_shape() -> None:
    with pytest.raises(ConfigurationError, match="each a positive int"):
        StrategyTarget("ddp", mesh=(2, 0))
    with pytest.raises(ConfigurationError, match="takes no mesh_shape argument") as caught:
        StrategyTarget(f"{__file__}:_no_mesh", mesh=(2, 2)).build()
    assert "give the factory a mesh_shape parameter" in str(caught.value)


def _no_mesh() -> Strategy:
    return StrategyRegistry.get("single_device")


def test_the_meshes_option_reads_world_sizes_and_shapes() -> None:
    assert _meshes("4:2x2,4:1x4,2:2x1") == {4: ((2, 2), (1, 4)), 2: ((2, 1),)}
    for bad, said in (
        ("4=2x2", "is not WORLD_SIZE:AxB"),
        ("4:2xx", "is not WORLD_SIZE:AxB"),
        ("4:2x3", "holds 6 ranks, not 4"),
        ("0:0x1", "holds 0 ranks, not 0"),
    ):
        with pytest.raises(pytest.UsageError, match=said):
            _meshes(bad)


class _Declared(ConformanceSuite):
    meshes: ClassVar[dict[int, tuple[tuple[int, ...], ...]]] = {4: ((2, 3),)}


def test_a_declared_mesh_must_hold_its_world_sizes_ranks() -> None:
    with pytest.raises(pytest.UsageError, match=r"_Declared.meshes: the mesh \(2, 3\)"):
        _declared_meshes(_Declared)


def test_a_mesh_lane_is_named_and_described_with_its_mesh() -> None:
    lane = Lane(StrategyTarget("tests/x.py:f", mesh=(2, 2)), "gloo", 4, 30.0)
    assert lane.id == "x:f-gloo-4-2x2"
    assert lane.names == ("x:f-gloo-4-2x2", "tests/x.py:f-gloo-4-2x2")
    assert lane.describe()["mesh"] == [2, 2]
    assert "mesh" not in Lane(StrategyTarget("ddp"), "gloo", 2, 30.0).describe()
