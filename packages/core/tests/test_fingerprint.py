import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.core import CollectiveCall

params = st.dictionaries(st.text(min_size=1, max_size=5), st.integers() | st.text(max_size=5))


@given(params=params)
def test_calls_with_the_same_parameters_are_equal_in_any_order(params: dict[str, object]) -> None:
    forward = CollectiveCall("reduce", params)
    backward = CollectiveCall("reduce", dict(reversed(params.items())))

    assert forward == backward
    assert hash(forward) == hash(backward)


def test_calls_differ_by_collective_or_any_parameter() -> None:
    call = CollectiveCall("reduce", {"op": "sum"})

    assert call != CollectiveCall("broadcast", {"op": "sum"})
    assert call != CollectiveCall("reduce", {"op": "max"})
    assert call != CollectiveCall("reduce", {"op": "sum", "dtype": "torch.int64"})


def test_a_call_describes_itself() -> None:
    call = CollectiveCall("all_gather", {"shape": (2, 3), "dtype": "torch.float32"})

    assert call.describe() == "all_gather(dtype=torch.float32, shape=(2, 3))"
    assert CollectiveCall("barrier").describe() == "barrier()"


def test_a_call_needs_a_collective_name() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        CollectiveCall("")
