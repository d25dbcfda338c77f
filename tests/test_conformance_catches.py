"""The conformance suite can fail: each deliberately broken strategy is caught.

Every strategy in ``conformance_broken.py`` breaks one clause of the contract; the
property that proves that clause must fail on it, shrink the failure to a small
example, and print a snippet that reproduces it alone.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plait.conformance import (
    PROPERTIES,
    AllGatherCase,
    Call,
    ContractViolation,
    MismatchCase,
    RankCrashError,
    RankHangError,
    RankPool,
    ReduceCase,
    TensorSpec,
    check,
    prove,
)

BROKEN = Path(__file__).resolve().with_name("conformance_broken.py")
BY_NAME = {prop.name: prop for prop in PROPERTIES}

CAUGHT = [
    ("MeanThatSums", "reduce_tensors", "ReduceCase(op='mean'"),
    ("TruncatingIntegerMean", "reduce_tensors", "must be floating"),
    ("MutatingReduce", "reduce_tensors", "changed its input"),
    ("BroadcastIgnoresSrc", "broadcast", "src=1"),
    ("ImpatientBarrier", "barrier", "left the barrier when only"),
    (
        "ReversedAllGather",
        "all_gather",
        "out of order: rows 0 to 1 hold the tensors of ranks [1, 0]",
    ),
    # Members gather over the whole job, which the outsider never joins: a hang.
    ("IgnoresGroups", "sub_groups", "was left waiting after rank 1 returned"),
    ("unchecked_ddp", "mismatch", "must raise CollectiveMismatchError"),
]


def _violation(
    flaw: str,
    property_name: str,
    *,
    shrink: bool = True,
    grid: bool = True,
    world_size: int = 2,
    max_examples: int = 300,
    seed: int | None = None,
) -> ContractViolation:
    with (
        RankPool(f"{BROKEN}:{flaw}", world_size=world_size, deadline=5) as pool,
        pytest.raises(ContractViolation) as caught,
    ):
        prove(
            pool,
            BY_NAME[property_name],
            max_examples=max_examples,
            shrink=shrink,
            seed=seed,
            grid=grid,
        )
    return caught.value


EVERY_RUN = [
    ("BroadcastReturnsInput", "broadcast", 2, "shares memory with its input tensor"),
    ("ReduceReturnsInputAlone", "reduce_tensors", 1, "shares memory with its input tensor"),
    ("GatherViewsInput", "all_gather", 1, "shares memory with its input tensor"),
    ("MaxAsSumForSmallInts", "reduce_tensors", 2, "ReduceCase(op='max'"),
    ("Float64ThroughFloat32", "reduce_tensors", 2, "'float64'"),
    ("MeanOverTwo", "reduce_tensors", 3, "ReduceCase(op='mean'"),
    ("WaitsForRankZero", "barrier", 2, "left the barrier when only"),
    ("WaitsForRankZero", "barrier", 3, "left the barrier when only"),
    # A spelling other than the lowercase name, read as a sum.
    ("SpellingSensitive", "reduce_tensors", 2, "ReduceCase(op='MEAN'"),
    ("SpellingSensitive", "reduce_numbers", 3, "ReduceCase(op='MEAN'"),
    # src read as a place in the group: only where the group renumbers its ranks.
    ("SrcAsGroupRank", "sub_groups", 2, "rank 1 (in the group [1]) raised IndexError"),
    ("SrcAsGroupRank", "sub_groups", 3, "rank 1 (in the group [1]) raised IndexError"),
    # A floating mean of integers, truncated: every size, not only two.
    ("TruncatedFloatMean", "reduce_tensors", 2, "ReduceCase(op='mean'"),
    ("TruncatedFloatMean", "reduce_tensors", 3, "ReduceCase(op='mean'"),
    # Narrow transports, shown by values at the dtype's extremes.
    ("Int64ThroughFloat64", "reduce_tensors", 2, "TensorSpec('int64', (2,), (4611686018427387903,"),
    ("BFloat16InFloat16", "reduce_tensors", 2, "element 0 is inf, expected 2048000.0"),
    # Right at powers of two; three ranks show it.
    ("PowerOfTwoSum", "reduce_tensors", 3, "ReduceCase(op='sum'"),
]
"""Flaws that drawn examples catch only by chance, and the grid in every run."""


@pytest.mark.slow
@pytest.mark.parametrize(("flaw", "property_name", "world_size", "problem"), EVERY_RUN)
def test_the_quick_profile_catches_narrow_flaws_in_every_run_whatever_the_seed(
    flaw: str, property_name: str, world_size: int, problem: str
) -> None:
    # The quick profile's 25 drawn examples may miss a flaw limited to three dtypes
    # of twelve, to three ranks, to one spelling or one src; the grid runs first in
    # every run, whatever the seed, and holds them. Three seeds on one pool.
    with RankPool(f"{BROKEN}:{flaw}", world_size=world_size, deadline=5) as pool:
        for seed in (0, 1, 2):
            with pytest.raises(ContractViolation) as caught:
                prove(pool, BY_NAME[property_name], max_examples=25, seed=seed)
            violation = caught.value
            assert violation.property == property_name
            assert violation.explicit, str(violation)
            message = str(violation)
            assert problem in message, message
            assert "on the property's grid: every run tries it first" in message


@pytest.mark.slow
def test_the_same_seed_draws_the_same_examples() -> None:
    first = _violation("Float64ThroughFloat32", "reduce_tensors", grid=False, seed=5)
    second = _violation("Float64ThroughFloat32", "reduce_tensors", grid=False, seed=5)

    assert first.case == second.case
    assert str(first) == str(second)


@pytest.mark.slow
def test_a_drawn_failure_names_the_seed_that_draws_it_again() -> None:
    violation = _violation("MeanThatSums", "reduce_tensors", grid=False, seed=11)

    assert not violation.explicit
    assert violation.seed == 11
    assert "rerun the property with --plait-seed=11" in str(violation)


@pytest.mark.slow
@pytest.mark.parametrize(("flaw", "property_name", "problem"), CAUGHT)
def test_each_broken_strategy_is_caught_by_the_property_it_breaks(
    flaw: str, property_name: str, problem: str
) -> None:
    # Mismatched calls reach gloo unchecked and may hang there, as group-blind ones
    # do: shrinking a hang costs a deadline per attempt, so those are reported as
    # first found.
    hangs = ("unchecked_ddp", "IgnoresGroups")
    violation = _violation(flaw, property_name, shrink=flaw not in hangs)

    assert violation.property == property_name
    message = str(violation)
    assert problem in message or (flaw == "unchecked_ddp" and "a hang" in message), message
    assert f"reproduce('{BROKEN}:{flaw}', " in message
    assert "world_size=2, backend='gloo')" in message


@pytest.mark.slow
def test_a_flaw_that_does_not_repeat_is_reported_as_a_violation_marked_intermittent() -> None:
    # Hypothesis reruns a failing example to report it; a flaw that shows only under
    # some timing (a barrier that leaves early by a millisecond) or only once passes
    # that rerun. It is still a broken contract, reported as such.
    violation = _violation("MeanThatSumsOnce", "reduce_tensors", shrink=False, grid=False)

    assert violation.intermittent
    message = str(violation)
    assert "broke the contract once but not when it was run again" in message, message
    assert isinstance(violation.case, ReduceCase), message
    assert violation.case.reduction == "mean", message  # in whichever spelling was drawn
    assert f"reproduce('{BROKEN}:MeanThatSumsOnce', " in message


@pytest.mark.slow
def test_a_failure_shrinks_to_a_minimal_example_whose_snippet_reproduces_it(
    tmp_path: Path,
) -> None:
    violation = _violation("MeanThatSums", "reduce_tensors", grid=False)

    # Shrunk: two ranks, one element each, the smallest values that tell a mean from
    # a sum (one zero and one non-zero).
    case = violation.case
    assert repr(case).startswith("ReduceCase(op='mean'")
    assert isinstance(case, ReduceCase)
    assert all(spec.shape == () for spec in case.inputs), case  # type: ignore[union-attr]
    snippet = str(violation).split("Run this example alone:\n", 1)[1]
    script = tmp_path / "reproduce_it.py"
    script.write_text(textwrap.dedent(snippet), encoding="utf-8")

    rerun = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )

    assert rerun.returncode == 1, rerun.stderr
    assert "ContractViolation: reduce_tensors failed" in rerun.stderr


def _gather(world_size: int) -> AllGatherCase:
    return AllGatherCase(tuple(TensorSpec("int64", (1,), (rank,)) for rank in range(world_size)))


def _healthy_run(pool: RankPool) -> None:
    case = ReduceCase("sum", tuple(TensorSpec("int64", (1,), (rank,)) for rank in range(3)))
    assert check(case, pool.run(case), pool.devices) == []


@pytest.mark.slow
def test_a_rank_that_dies_fails_the_example_with_its_exit_code_and_the_pool_restarts() -> None:
    with RankPool(f"{BROKEN}:DyingAllGather", world_size=3, deadline=10) as pool:
        with pytest.raises(RankCrashError) as crashed:
            pool.run(_gather(3))
        assert not pool.running  # every rank was stopped, none left behind

        _healthy_run(pool)  # a fresh pool, started on demand

    message = str(crashed.value)
    assert "rank 2 died (exit code 3) during the example" in message
    assert pool.starts == 2


@pytest.mark.slow
def test_a_hang_fails_the_example_with_every_stuck_ranks_stack_and_the_pool_restarts() -> None:
    barrier, reduce_sum = Call("barrier"), Call("reduce", TensorSpec("int64", (1,), (0,)), "sum")
    with RankPool(f"{BROKEN}:unchecked_ddp", world_size=3, deadline=3) as pool:
        with pytest.raises(RankHangError) as hung:
            pool.run(MismatchCase((reduce_sum, reduce_sum, barrier)))
        assert not pool.running

        _healthy_run(pool)

    message = str(hung.value)
    assert "did not finish within 3 s (a hang)" in message
    for rank in (0, 1):  # the two ranks inside the unchecked all_reduce
        assert f"rank {rank} (pid" in message
    assert "in _invoke" in message  # where each stuck rank is, from its own stack


@pytest.mark.slow
def test_a_rank_left_waiting_after_the_others_returned_is_a_hang_long_before_the_deadline() -> None:
    # A barrier that does not wait lets rank 1 through: both ranks raise the
    # mismatch, and rank 1 is back from the plain reduce that follows while rank 0
    # still waits in it. The pool does not wait out the 60 s deadline, and says
    # which rank was left, in which call.
    send = Call("broadcast", TensorSpec("int64", (1,), (0,)), 0)
    with RankPool(f"{BROKEN}:ImpatientBarrier", world_size=2, deadline=60) as pool:
        with pytest.raises(RankHangError) as hung:
            pool.run(MismatchCase((send, Call("barrier"))))
        assert not pool.running

    message = str(hung.value)
    first = message.splitlines()[0]
    assert first.startswith("rank 0 in reduce() (the plain reduce every rank runs after"), first
    assert "was left waiting after rank 1 returned" in first, first
    assert "did not finish within 60 s" not in message
    assert "rank 0 (pid" in message


MESH_FLAWS = [
    # The dimension's collectives span the job: sums of every rank, rows of every rank.
    ("reduces_over_the_world", (2, 2), "tp", "groups [0, 1] and [2, 3]"),
    ("reduces_over_the_world", (2, 1), "tp", "groups [0] and [1]"),
    # tp read as dp_shard and the reverse: groups of the right size, the wrong ranks.
    ("reduces_over_the_wrong_dimension", (2, 2), "dp_shard", "groups [0, 2] and [1, 3]"),
    ("reduces_over_the_wrong_dimension", (1, 4), "tp", "groups [0, 1, 2, 3]"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("flaw", "mesh", "dimension", "groups"), MESH_FLAWS)
def test_a_mesh_strategy_collecting_over_the_wrong_ranks_is_caught_in_every_run(
    flaw: str, mesh: tuple[int, int], dimension: str, groups: str
) -> None:
    world_size = mesh[0] * mesh[1]
    with RankPool(f"{BROKEN}:{flaw}", world_size=world_size, mesh=mesh, deadline=5) as pool:
        lane = pool.along(dimension)
        for seed in (0, 1):  # the grid holds it, whatever the seed
            for name in ("reduce_tensors", "all_gather"):
                with pytest.raises(ContractViolation) as caught:
                    prove(lane, BY_NAME[name], max_examples=25, seed=seed)
                violation = caught.value
                assert violation.explicit, str(violation)
                mesh_text = f"{mesh[0]}x{mesh[1]}"
                assert (
                    f"{name} failed for 'conformance_broken:{flaw}' (gloo, world size "
                    f"{world_size}, mesh {mesh_text}, over {dimension!r}: {groups})"
                ) in violation.headline
                assert f"[over {dimension!r}, in the group of global ranks [" in str(violation)
                assert (
                    f"world_size={world_size}, backend='gloo', mesh={mesh}, "
                    f"dimension={dimension!r})"
                ) in violation.snippet


@pytest.mark.slow
def test_a_mesh_whose_groups_are_not_its_coordinates_is_caught_by_point_to_point() -> None:
    # Its collectives take the strategy's own groups, which are right, and pass; a
    # pipeline's stages take the mesh's (dp_shard's is tp's), and would talk to the
    # wrong ranks.
    flaw = "mesh_of_swapped_groups"
    with RankPool(f"{BROKEN}:{flaw}", world_size=4, mesh=(2, 2), deadline=10) as pool:
        lane = pool.along("dp_shard")
        assert prove(lane, BY_NAME["reduce_tensors"], max_examples=5, grid=False, seed=0) == 5
        for seed in (0, 1):
            with pytest.raises(ContractViolation) as caught:
                prove(lane, BY_NAME["point_to_point"], max_examples=25, seed=seed)
            violation = caught.value
            assert violation.explicit, str(violation)
            assert (
                f"point_to_point failed for 'conformance_broken:{flaw}' (gloo, world size 4, "
                "mesh 2x2, over 'dp_shard': groups [0, 2] and [1, 3]): rank 0 raised "
                "ConfigurationError: device_mesh.get_group('dp_shard') holds the global ranks "
                "[0, 1], but the mesh's coordinates put global rank 0 in the group [0, 2]"
            ) in violation.headline
        # Along tp the swapped mesh gives dp_shard's groups: caught there too.
        with pytest.raises(ContractViolation, match=r"get_group\('tp'\) holds the global ranks"):
            prove(pool.along("tp"), BY_NAME["point_to_point"], max_examples=25, seed=0)
