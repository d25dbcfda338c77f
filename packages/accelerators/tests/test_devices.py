import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.accelerators import parse_device_spec
from plait.core import ConfigurationError


def gpus(spec: object, available: int = 4) -> tuple[int, ...]:
    return parse_device_spec(spec, accelerator="cuda", available=available, auto=available)


def cpus(spec: object) -> tuple[int, ...]:
    return parse_device_spec(spec, accelerator="cpu", available=None, auto=1)


@pytest.mark.parametrize(
    ("spec", "indices"),
    [
        (2, (0, 1)),
        ("2", (0, 1)),
        (" 3 ", (0, 1, 2)),
        ([0, 2], (0, 2)),
        ((3, 1), (3, 1)),
        ("0,2", (0, 2)),
        ("1,", (1,)),
        (" 1 , 3 ", (1, 3)),
        (-1, (0, 1, 2, 3)),
        ("-1", (0, 1, 2, 3)),
        ("auto", (0, 1, 2, 3)),
        ("AUTO", (0, 1, 2, 3)),
    ],
)
def test_specs_as_users_write_them(spec: object, indices: tuple[int, ...]) -> None:
    assert gpus(spec) == indices


@given(count=st.integers(min_value=1, max_value=64))
def test_a_cpu_count_is_that_many_processes(count: int) -> None:
    assert cpus(count) == tuple(range(count))
    assert cpus(str(count)) == tuple(range(count))


def test_auto_on_the_cpu_is_one_process() -> None:
    assert cpus("auto") == (0,)


@given(available=st.integers(min_value=1, max_value=16), data=st.data())
def test_any_valid_index_list_round_trips(available: int, data: st.DataObject) -> None:
    indices = data.draw(
        st.lists(st.integers(0, available - 1), min_size=1, unique=True), label="indices"
    )

    assert gpus(indices, available) == tuple(indices)
    # A trailing comma marks a list: "0," is device 0, where "0" would be a count.
    assert gpus(",".join(map(str, indices)) + ",", available) == tuple(indices)


@pytest.mark.parametrize(
    ("spec", "message", "fix"),
    [
        (0, "devices=0 asks for no device", "devices=1 or more"),
        (-2, "devices=-2 asks for no device", "devices=1 or more"),
        (
            5,
            "asks for 5 cuda devices, but this machine has 4 cuda device(s) (indices 0, 1, 2, 3)",
            "devices=4",
        ),
        ([0, 0, 1], "names device(s) [0] more than once", "devices=[0, 1]"),
        ([1, 7], "names cuda device(s) [7] that do not exist", "from 0 to 3"),
        ([-1], "names cuda device(s) [-1] that do not exist", "from 0 to 3"),
        ([], "asks for no device", "devices=[0]"),
        ([0, "1"], "holds ['1'], which are not device indices", "as ints"),
        (True, "is a bool, which is not a device spec", "an int (2)"),
        (2.0, "is a float, which is not a device spec", "an int (2)"),
        (None, "is a NoneType, which is not a device spec", "an int (2)"),
        ("two", "'two' is not a device spec", "a list of indices"),
        ("0,,2", "'0,,2' is not a device spec", "a list of indices"),
    ],
)
def test_each_invalid_spec_says_what_was_asked_what_exists_and_what_to_write(
    spec: object, message: str, fix: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        gpus(spec)

    assert message in str(caught.value)
    assert caught.value.fix is not None
    assert fix in caught.value.fix
    assert caught.value.value == spec or caught.value.value == list(spec)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (-1, "devices=-1 means every device, which has no meaning for cpu"),
        ([0, 1], "picks device indices, but cpu devices are processes"),
        ("0,1", "picks device indices, but cpu devices are processes"),
    ],
)
def test_the_cpu_has_no_indices_and_no_every_device(spec: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match="devices=") as caught:
        cpus(spec)

    assert message in str(caught.value)
    assert caught.value.fix is not None
    assert "devices=2" in caught.value.fix


def test_no_device_at_all_suggests_another_accelerator() -> None:
    with pytest.raises(ConfigurationError, match="this machine has no cuda device") as caught:
        gpus(-1, available=0)

    assert caught.value.fix == "use another accelerator, e.g. accelerator='cpu'"
