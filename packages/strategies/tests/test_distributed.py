"""Real ranks on gloo: the collective contract, mismatches, timeouts and DDP.

Each rank is a process running ``rank_main.py`` with the variables a launcher sets.
"""

from collections.abc import Callable
from pathlib import Path

import pytest

RunRanks = Callable[..., list[str]]
StartRanks = Callable[..., list[str]]  # the fixture of the root conftest.py

RANK_SCRIPT = Path(__file__).resolve().parent / "rank_main.py"


def _agreed(outputs: list[str], world_size: int, agreement: str) -> None:
    # Every rank says it took the path ``agreement`` asks for.
    if world_size > 1:  # one process has nothing to agree with
        path = "backend" if agreement == "backend" else "store"
        assert all(f"agreeing through the {path}" in output for output in outputs)


@pytest.fixture
def run_ranks(start_ranks: StartRanks) -> RunRanks:
    """Run ``rank_main.py SCENARIO`` as ``world_size`` ranks; return their outputs.

    ``agreement`` is how the ranks agree on checked calls (``PLAIT_CHECK_AGREEMENT``);
    every rank must say it took that path.
    """

    def run(
        scenario: str, world_size: int, timeout: float = 120, agreement: str = "auto"
    ) -> list[str]:
        outputs = start_ranks(
            RANK_SCRIPT,
            [scenario],
            world_size,
            environ={"PLAIT_CHECK_AGREEMENT": agreement},
            timeout=timeout,
        )
        _agreed(outputs, world_size, agreement)
        return outputs

    return run


CONTRACT = ("collectives", "collectives_unchecked", "broadcasts", "broadcasts_unchecked")
SHARED_JOBS = {
    1: CONTRACT,
    2: (*CONTRACT, "mismatch", "background_save_then_load", "batch_norm_saved"),
    3: (*CONTRACT, "groups", "groups_unchecked", "mismatch"),
}
"""The scenarios one job runs in turn, by world size: those that leave the ranks in
step, each on a strategy of its own. A job per world size and agreement path runs
them all, instead of a job per test."""

SHARED = pytest.mark.xdist_group("strategies_shared_jobs")
"""The tests of the shared jobs run on one pytest-xdist worker: each job runs once."""


@pytest.fixture(scope="module")
def scenario_outputs(start_ranks: StartRanks) -> RunRanks:
    """Each rank's output of ``scenario`` in the shared job of its world size and agreement.

    The job runs at the first test that needs it; a job that failed fails every test
    of its scenarios, with its output (whose headers say which scenario failed).
    """
    jobs: dict[tuple[int, str], list[str] | AssertionError] = {}

    def outputs(scenario: str, world_size: int, agreement: str) -> list[str]:
        key = (world_size, agreement)
        if key not in jobs:
            try:
                jobs[key] = start_ranks(
                    RANK_SCRIPT,
                    [",".join(SHARED_JOBS[world_size])],
                    world_size,
                    environ={"PLAIT_CHECK_AGREEMENT": agreement},
                )
            except AssertionError as failure:
                jobs[key] = failure
        job = jobs[key]
        if isinstance(job, AssertionError):
            raise AssertionError(f"the shared job of {world_size} rank(s) failed:\n{job}")
        sections = [_section(output, scenario) for output in job]
        _agreed(sections, world_size, agreement)
        return sections

    return outputs


def _section(output: str, scenario: str) -> str:
    """What a rank printed while it ran ``scenario`` (under its header line)."""
    header = f"== scenario {scenario}\n"
    assert header in output, f"{scenario} did not run:\n{output}"
    return output.split(header, 1)[1].split("== scenario ", 1)[0]


AGREEMENTS = pytest.mark.parametrize("agreement", ["auto", "backend"])
"""Both ways ranks agree on a call: through the store (``auto`` at a few ranks) and
through the process group (``backend``, the path of large groups)."""


@pytest.mark.slow
@SHARED
@AGREEMENTS
@pytest.mark.parametrize("scenario", ["collectives", "collectives_unchecked"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_collective_contract_holds_on_every_rank(
    scenario_outputs: RunRanks, world_size: int, scenario: str, agreement: str
) -> None:
    outputs = scenario_outputs(scenario, world_size, agreement)

    assert all("collectives ok" in output for output in outputs)


@pytest.mark.slow
@SHARED
@AGREEMENTS
@pytest.mark.parametrize("scenario", ["groups", "groups_unchecked"])
def test_collectives_over_a_sub_group_keep_the_contract_among_its_ranks(
    scenario_outputs: RunRanks, scenario: str, agreement: str
) -> None:
    outputs = scenario_outputs(scenario, 3, agreement)

    assert all("groups ok" in output for output in outputs)


@pytest.mark.slow
@SHARED
@AGREEMENTS
@pytest.mark.parametrize("scenario", ["broadcasts", "broadcasts_unchecked"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_broadcast_gives_every_rank_src_value_small_or_large(
    scenario_outputs: RunRanks, world_size: int, scenario: str, agreement: str
) -> None:
    outputs = scenario_outputs(scenario, world_size, agreement)

    assert all("broadcasts ok" in output for output in outputs)


@pytest.mark.slow
@SHARED
@AGREEMENTS
@pytest.mark.parametrize("world_size", [2, 3])
def test_mismatched_calls_raise_on_every_rank_and_leave_the_ranks_in_step(
    scenario_outputs: RunRanks, world_size: int, agreement: str
) -> None:
    outputs = scenario_outputs("mismatch", world_size, agreement)

    for output in outputs:
        assert "mismatch ok" in output
        if world_size > 2:  # rank 0 alone called sum: the others agree on max
            assert "disagreeing [0]" in output
        else:  # a tie goes to the call of the lowest rank
            assert "disagreeing [1]" in output


@pytest.mark.slow
@SHARED
def test_a_checkpoint_saved_in_the_background_by_rank_0_is_whole_when_any_rank_loads_it(
    scenario_outputs: RunRanks,
) -> None:
    outputs = scenario_outputs("background_save_then_load", 2, "auto")

    assert all("background saves ok" in output for output in outputs)


@pytest.mark.slow
@SHARED
def test_a_ddp_checkpoint_every_rank_writes_holds_rank_0s_batch_norm_statistics(
    scenario_outputs: RunRanks,
) -> None:
    outputs = scenario_outputs("batch_norm_saved", 2, "auto")

    assert all("rank 0's buffers saved and loaded" in output for output in outputs)


@pytest.mark.slow
@AGREEMENTS
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_barrier_timeout_names_the_rank_that_did_not_come(
    run_ranks: RunRanks, world_size: int, agreement: str
) -> None:
    outputs = run_ranks("barrier_timeout", world_size, agreement=agreement)

    last = world_size - 1
    for rank, output in enumerate(outputs[:last]):
        assert f"missing [{last}]" in output
        assert f"barrier 'epoch' timed out after 2 s: ranks {last} did not arrive" in output
        # The flight recorder's note: this rank's last calls, the barrier last.
        assert f"rank {rank}'s last collectives:" in output
        assert f"barrier(name=epoch) over ranks {list(range(world_size))}" in output
        assert "timed out after 2 s" in output


@pytest.mark.slow
def test_a_timeout_says_where_a_missing_rank_waits_instead(run_ranks: RunRanks) -> None:
    # Through the process group, a rank that waits a while posts where; ranks 0 and
    # 1 wait in a barrier of all three, rank 2 in one of ranks 1 and 2.
    outputs = run_ranks("waiting_elsewhere", 3, agreement="backend")

    for output in outputs[:2]:
        assert "barrier 'all' timed out after 4 s: ranks 2 did not arrive (arrived: 0, 1)" in output
        assert (
            "where missing ranks were last seen waiting: "
            "rank 2 in barrier(name=pair) over ranks [1, 2]"
        ) in output
    assert "barrier 'pair' timed out after 6 s: ranks 1 did not arrive (arrived: 2)" in outputs[2]
    assert "rank 1 in barrier(name=all) over ranks [0, 1, 2]" in outputs[2]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_on_shards_matches_one_process_on_the_whole_batch(
    run_ranks: RunRanks, world_size: int
) -> None:
    outputs = run_ranks("ddp_equivalence", world_size)

    assert all("ddp matches one process" in output for output in outputs)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["fp16_hook", "fp16_wrapper"])
def test_a_compression_hook_is_really_applied(run_ranks: RunRanks, scenario: str) -> None:
    outputs = run_ranks(scenario, 2)

    assert all("fp16 compression applied" in output for output in outputs)


@pytest.mark.slow
def test_sharded_optimizer_state_trains_like_one_process_and_is_split(run_ranks: RunRanks) -> None:
    outputs = run_ranks("sharded_equivalence", 2)

    assert all("sharded matches one process, holds 1 of 2" in output for output in outputs)


@pytest.mark.slow
def test_model_averaging_really_averages_the_replicas(run_ranks: RunRanks) -> None:
    outputs = run_ranks("model_averaging", 2)

    assert all("replicas averaged every 2 steps" in output for output in outputs)


@pytest.mark.slow
def test_static_graph_ddp_matches_one_process(run_ranks: RunRanks) -> None:
    outputs = run_ranks("static_graph", 2)

    assert all("ddp matches one process" in output for output in outputs)
