import pytest
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from plait.core import ConfigurationError, ReduceOp

SPELLINGS = {
    "sum": ReduceOp.SUM,
    "mean": ReduceOp.MEAN,
    "avg": ReduceOp.MEAN,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "product": ReduceOp.PRODUCT,
}


@st.composite
def any_case(draw: st.DrawFn, word: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    padding = st.sampled_from(["", " ", "\t", "  "])
    cased = "".join(c.upper() if flip else c for c, flip in zip(word, flips, strict=True))
    return draw(padding) + cased + draw(padding)


@given(data=st.data(), spelling=st.sampled_from(sorted(SPELLINGS)))
def test_every_spelling_parses_in_any_case(data: st.DataObject, spelling: str) -> None:
    written = data.draw(any_case(spelling), label="written")

    assert ReduceOp.parse(written) is SPELLINGS[spelling]


@given(op=st.sampled_from(list(ReduceOp)))
def test_an_op_round_trips_through_its_string(op: ReduceOp) -> None:
    assert ReduceOp.parse(str(op)) is op
    assert ReduceOp.parse(op) is op


@given(text=st.text(max_size=12).filter(lambda t: t.strip().lower() not in SPELLINGS))
def test_anything_else_is_rejected_with_every_choice_listed(text: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ReduceOp.parse(text)

    assert caught.value.value == text
    assert set(caught.value.choices) == set(SPELLINGS)
    for choice in SPELLINGS:
        assert repr(choice) in str(caught.value)


@pytest.mark.parametrize(
    ("typo", "meant"), [("summ", "sum"), ("prod", "product"), ("maximum", "max")]
)
def test_a_typo_gets_a_suggestion(typo: str, meant: str) -> None:
    with pytest.raises(ConfigurationError, match=f"did you mean '{meant}'"):
        ReduceOp.parse(typo)


@pytest.mark.parametrize("value", [None, 1, 2.0, ["sum"], b"sum"])
def test_a_value_of_the_wrong_type_is_rejected_naming_its_type(value: object) -> None:
    with pytest.raises(ConfigurationError, match=type(value).__name__):
        ReduceOp.parse(value)


@pytest.mark.parametrize(
    ("torch_op", "op"),
    [
        (dist.ReduceOp.SUM, ReduceOp.SUM),
        (dist.ReduceOp.AVG, ReduceOp.MEAN),
        (dist.ReduceOp.PRODUCT, ReduceOp.PRODUCT),
        (dist.ReduceOp.MIN, ReduceOp.MIN),
        (dist.ReduceOp.MAX, ReduceOp.MAX),
        (dist.ReduceOp(dist.ReduceOp.MAX), ReduceOp.MAX),
    ],
)
def test_torch_distributed_ops_are_accepted(torch_op: object, op: ReduceOp) -> None:
    assert ReduceOp.parse(torch_op) is op


@pytest.mark.parametrize("torch_op", [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR])
def test_torch_ops_outside_the_contract_are_rejected(torch_op: object) -> None:
    with pytest.raises(ConfigurationError, match="bitwise"):
        ReduceOp.parse(torch_op)
