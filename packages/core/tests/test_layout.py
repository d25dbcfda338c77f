import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.core import ConfigurationError, ProcessLayout, RankInfo

layouts = st.builds(
    ProcessLayout,
    num_nodes=st.integers(min_value=1, max_value=8),
    processes_per_node=st.integers(min_value=1, max_value=8),
)


@given(layout=layouts)
def test_the_ranks_of_a_layout_number_every_process_once_in_order(layout: ProcessLayout) -> None:
    ranks = list(layout.ranks())

    assert [info.global_rank for info in ranks] == list(range(layout.world_size))
    assert len({(info.node_rank, info.local_rank) for info in ranks}) == layout.world_size
    assert all(info.world_size == layout.world_size for info in ranks)
    assert [info.is_global_zero for info in ranks].count(True) == 1


@pytest.mark.parametrize(("num_nodes", "processes_per_node"), [(0, 1), (1, 0), (-2, 4)])
def test_a_layout_needs_at_least_one_node_and_process(
    num_nodes: int, processes_per_node: int
) -> None:
    with pytest.raises(ConfigurationError, match="must be at least 1"):
        ProcessLayout(num_nodes=num_nodes, processes_per_node=processes_per_node)


def test_a_bool_is_not_a_count() -> None:
    with pytest.raises(TypeError, match=r"must be an int, got True of type bool"):
        ProcessLayout(num_nodes=True, processes_per_node=2)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"global_rank": 4}, "global_rank 4 is outside the world"),
        ({"local_rank": 2}, "local_rank 2 is outside its node"),
        ({"local_world_size": 8}, "exceeds world_size"),
        ({"node_rank": -1}, "must be 0 or more"),
    ],
)
def test_rank_info_rejects_impossible_ranks(fields: dict[str, int], message: str) -> None:
    valid = {
        "global_rank": 1,
        "local_rank": 1,
        "node_rank": 0,
        "world_size": 4,
        "local_world_size": 2,
    }
    with pytest.raises(ConfigurationError, match=message):
        RankInfo(**{**valid, **fields})


def test_a_single_process_is_global_zero() -> None:
    info = RankInfo.single_process()

    assert info.is_global_zero
    assert (info.world_size, info.local_world_size) == (1, 1)
