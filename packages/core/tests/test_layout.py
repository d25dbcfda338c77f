import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.core import ConfigurationError, NodeLayout, ProcessLayout, RankInfo

layouts = st.builds(
    NodeLayout,
    num_nodes=st.integers(min_value=1, max_value=8),
    processes_per_node=st.integers(min_value=1, max_value=8),
)


@given(layout=layouts)
def test_the_ranks_of_a_layout_number_every_process_once_in_order(layout: NodeLayout) -> None:
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
        NodeLayout(num_nodes=num_nodes, processes_per_node=processes_per_node)


def test_a_bool_is_not_a_count() -> None:
    with pytest.raises(TypeError, match=r"must be an int, got True of type bool"):
        NodeLayout(num_nodes=True, processes_per_node=2)


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


@given(
    data_parallel=st.integers(min_value=1, max_value=4),
    tensor=st.integers(min_value=1, max_value=4),
    data=st.data(),
)
def test_a_process_layout_holds_its_dimensions_and_defaults_to_plain_data_parallel(
    data_parallel: int, tensor: int, data: st.DataObject
) -> None:
    world = data_parallel * tensor
    rank = data.draw(st.integers(min_value=0, max_value=world - 1))
    layout = ProcessLayout(
        world_size=world,
        global_rank=rank,
        data_parallel_size=data_parallel,
        data_parallel_rank=rank // tensor,
        dimensions={"tp": tensor},
        coordinates={"tp": rank % tensor},
    )
    assert layout.dimensions == {"tp": tensor}
    assert (layout.tensor_parallel_rank, layout.tensor_parallel_size) == (rank % tensor, tensor)
    assert (layout.rank_in("cp"), layout.size_of("cp")) == (0, 1)  # a dimension it has not
    plain = ProcessLayout(world_size=world, global_rank=rank)
    assert (plain.data_parallel_rank, plain.data_parallel_size) == (rank, world)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"global_rank": 4}, "global_rank 4 is outside the world"),
        ({"data_parallel_rank": 2}, r"data_parallel_rank 2 is outside \[0, 2\)"),
        ({"dimensions": {"tp": 3}}, r"hold 6 processes, and the world has 4"),
        ({"dimensions": {"tp": 0}}, "has size 0"),
        ({"dimensions": {"data_parallel": 2}}, "given by data_parallel_size"),
        ({"coordinates": {"tp": 2}}, r"tp=2 is outside the dimension \[0, 2\)"),
        ({"coordinates": {"tp": -1}}, r"tp=-1 is outside"),
        ({"coordinates": {"tp": True}}, r"tp=True is outside"),
        ({"coordinates": {"pp": 0}}, "'pp' names no dimension of the layout"),
    ],
)
def test_a_process_layout_rejects_impossible_values(
    fields: dict[str, object], message: str
) -> None:
    valid: dict[str, object] = {
        "world_size": 4,
        "global_rank": 1,
        "data_parallel_size": 2,
        "data_parallel_rank": 0,
        "dimensions": {"tp": 2},
        "coordinates": {"tp": 1},
    }
    with pytest.raises(ConfigurationError, match=message):
        ProcessLayout(**{**valid, **fields})  # type: ignore[arg-type]


def test_a_process_layout_is_frozen() -> None:
    layout = ProcessLayout(world_size=2, global_rank=1, dimensions={})
    with pytest.raises(TypeError):
        layout.dimensions["tensor"] = 2  # type: ignore[index]
