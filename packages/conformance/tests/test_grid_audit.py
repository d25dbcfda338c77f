"""The grid, audited against the slips it exists to show, per dtype and world size.

Each slip is computed here in one process, as a strategy that made it would compute
each rank's result; `check` must find it on some example of the grid, in every run
(the grid runs first whatever the profile or seed). The correct computation, done
the same way, must pass every example: otherwise the audit would prove nothing.
The conformance guide's audit table is this file, in words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import pytest
import torch

from plait.conformance import (
    AllGatherCase,
    BroadcastCase,
    GroupCase,
    Message,
    PointToPointCase,
    ReduceCase,
    TensorSpec,
    check,
)
from plait.conformance.cases import (
    COMPLEX_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    OPS,
    Case,
    spellings_of,
)
from plait.conformance.generate import dtypes_for
from plait.conformance.kinds.all_gather import all_gather_grid
from plait.conformance.kinds.broadcast import broadcast_grid
from plait.conformance.kinds.groups import sub_group_grid
from plait.conformance.kinds.point_to_point import point_to_point_grid
from plait.conformance.kinds.reduce import reduce_number_grid, reduce_tensor_grid
from plait.conformance.outcomes import Outcome, RaisedError
from plait.conformance.worker import describe_tensor, materialize

WORLD_SIZES = (1, 2, 3, 4, 5)
"""The suite's default sizes (1, 2, 3), the 4 plait's own CI adds, and one more odd size."""

Reduction = Callable[[str, torch.Tensor], torch.Tensor]
"""How a strategy reduces: ``(op, stacked rank inputs) -> result``."""

_CPU = torch.device("cpu")
_WIDE = {**dict.fromkeys(INT_DTYPES, torch.int64), "bool": torch.int64}


def _right(op: str, stacked: torch.Tensor) -> torch.Tensor:
    """The contract's reduce, computed wide and returned in the contract's dtype."""
    dtype = stacked.dtype
    if dtype.is_complex:
        wide = stacked.to(torch.complex128)
    elif dtype.is_floating_point:
        wide = stacked.to(torch.float64)
    else:
        wide = stacked.to(torch.int64)
    if op == "sum":
        out = wide.sum(0)
        return out if dtype == torch.bool else out.to(dtype)
    if op == "mean":
        mean = wide.to(torch.complex128 if dtype.is_complex else torch.float64).mean(0)
        return mean if not (dtype.is_floating_point or dtype.is_complex) else mean.to(dtype)
    if op == "product":
        return wide.prod(0).to(dtype)
    return (wide.amin(0) if op == "min" else wide.amax(0)).to(dtype)


def _outcomes(case: ReduceCase, reduction: Reduction) -> list[Outcome]:
    specs = [spec for spec in case.inputs if isinstance(spec, TensorSpec)]
    stacked = torch.stack([materialize(spec, _CPU) for spec in specs])
    result = describe_tensor(reduction(case.reduction, stacked))
    return [Outcome(rank, result=result) for rank in range(len(specs))]


def _caught(cases: Sequence[Case], reduction: Reduction) -> list[ReduceCase]:
    return [
        case
        for case in cases
        if isinstance(case, ReduceCase) and check(case, _outcomes(case, reduction), ["cpu"] * 5)
    ]


def _tensor_reduces(world_size: int, dtype: str | None = None) -> list[ReduceCase]:
    return [
        case
        for case in reduce_tensor_grid(world_size)
        if isinstance(case, ReduceCase)
        and isinstance(case.inputs[0], TensorSpec)
        and (dtype is None or case.inputs[0].dtype == dtype)
    ]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_the_right_reduce_passes_every_example_of_the_grid(world_size: int) -> None:
    assert _caught(_tensor_reduces(world_size), _right) == []


@pytest.mark.parametrize("world_size", WORLD_SIZES[1:])
@pytest.mark.parametrize("op", [op for op in OPS if op != "sum"])
def test_every_spelling_of_every_op_is_on_the_grid_where_a_sum_in_its_place_shows(
    world_size: int, op: str
) -> None:
    # A strategy that parses ops itself and reduces any other spelling as a sum.
    cases = _tensor_reduces(world_size)
    for spelling in spellings_of(op)[1:]:
        spelt = [case for case in cases if case.op == spelling]

        def slip(name: str, stacked: torch.Tensor) -> torch.Tensor:
            return _right("sum", stacked)

        assert spelt, f"{spelling!r} is not on the grid"
        assert _caught(spelt, slip), f"{spelling!r} read as a sum passes at {world_size} ranks"


@pytest.mark.parametrize("world_size", WORLD_SIZES[1:])
@pytest.mark.parametrize("dtype", [*INT_DTYPES, "bool"])
def test_a_truncated_integer_mean_shows_for_every_integer_dtype_at_every_world_size(
    world_size: int, dtype: str
) -> None:
    # The mean of integers computed right, floating, but cut to a whole number first.
    def slip(op: str, stacked: torch.Tensor) -> torch.Tensor:
        right = _right(op, stacked)
        return torch.trunc(right) if op == "mean" else right

    means = [case for case in _tensor_reduces(world_size, dtype) if case.reduction == "mean"]
    assert _caught(means, slip), f"a truncating {dtype} mean passes at {world_size} ranks"


def _numbers_mean_truncated(case: ReduceCase) -> list[Outcome]:
    values = [value for value in case.inputs if isinstance(value, int | float)]
    mean = sum(values) / len(values)
    return [Outcome(rank, result=float(int(mean))) for rank in range(len(values))]


@pytest.mark.parametrize("world_size", WORLD_SIZES[1:])
def test_a_truncated_mean_of_python_ints_shows_at_every_world_size(world_size: int) -> None:
    means = [
        case
        for case in reduce_number_grid(world_size)
        if isinstance(case, ReduceCase)
        and case.reduction == "mean"
        and all(isinstance(value, int) for value in case.inputs)
    ]
    assert any(check(case, _numbers_mean_truncated(case), ["cpu"] * 5) for case in means)


_INT_CARRIERS = {
    "int64": ("float64", "float32", "int32"),
    "int32": ("float32", "int16"),
    "int16": ("float16", "bfloat16", "int8"),
    "int8": ("uint8",),
    "uint8": ("int8",),
}
"""Each integer dtype, and what a lossy transport might move it as."""

_REINTERPRETED = {("int8", "uint8"), ("uint8", "int8")}
"""Carriers of the same width: the bits arrive whole, so sums and products (modular
arithmetic) come out right, and one rank's value is its own; only an order over two
ranks or more (min, max) can go wrong."""


def _through(carrier: str) -> Reduction:
    # Moved as the carrier, reduced and held in it, handed back in the input's dtype.
    def reduction(op: str, stacked: torch.Tensor) -> torch.Tensor:
        kind = getattr(torch, carrier)
        held = _right(op, stacked.to(kind)).to(kind)
        return held if op == "mean" else held.to(stacked.dtype)

    return reduction


_INT_SLIPS = [
    (world_size, dtype, carrier, op)
    for world_size in WORLD_SIZES
    for dtype, carriers in _INT_CARRIERS.items()
    for carrier in carriers
    for op in ("sum", "min", "max", "product")
    if (dtype, carrier) not in _REINTERPRETED or (op in ("min", "max") and world_size > 1)
]


@pytest.mark.parametrize(("world_size", "dtype", "carrier", "op"), _INT_SLIPS)
def test_an_integer_reduced_through_a_narrower_dtype_shows_at_its_extremes(
    world_size: int, dtype: str, carrier: str, op: str
) -> None:
    cases = [case for case in _tensor_reduces(world_size, dtype) if case.reduction == op]
    assert _caught(cases, _through(carrier)), (
        f"{op} of {dtype} through {carrier} passes at {world_size} ranks"
    )


_FLOAT_CARRIERS = {
    "float64": ("float32",),
    "float32": ("bfloat16", "float16"),
    "bfloat16": ("float16",),
    "float16": ("bfloat16",),
    "complex128": ("complex64",),
}
"""Each floating dtype, and the narrower one a slip might reduce it in."""

_WITHIN_TOLERANCE = {("float16", "bfloat16"): 3}
"""From this many ranks on, rounding through the carrier stays within the tolerance
the contract allows a sum, mean or product (``n + 1`` roundings of the dtype):
bfloat16 keeps 8 bits where float16 keeps 11, and 4 roundings of float16 are as
wide as one of bfloat16. Only min and max (exact) can show it there."""


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize(
    ("dtype", "carrier"),
    [(dtype, carrier) for dtype, carriers in _FLOAT_CARRIERS.items() for carrier in carriers],
)
def test_a_float_reduced_in_a_narrower_dtype_shows_for_every_op(
    world_size: int, dtype: str, carrier: str
) -> None:
    inexact_from = _WITHIN_TOLERANCE.get((dtype, carrier), len(WORLD_SIZES) + 1)
    for op in dtypes_ops(dtype):
        if world_size >= inexact_from and op not in ("min", "max"):
            continue
        cases = [case for case in _tensor_reduces(world_size, dtype) if case.reduction == op]
        assert _caught(cases, _through(carrier)), (
            f"{op} of {dtype} in {carrier} passes at {world_size} ranks"
        )


def dtypes_ops(dtype: str) -> list[str]:
    """The ops the contract defines on ``dtype``."""
    return [op for op in OPS if dtype in dtypes_for(op)]


def _first_ranks(op: str, stacked: torch.Tensor) -> torch.Tensor:
    # A tree that halves the ranks, written for powers of two: the ranks beyond the
    # largest power of two at or below the world size are never added in.
    size = stacked.shape[0]
    kept = 1 << (size.bit_length() - 1)
    return _right(op, stacked[:kept])


@pytest.mark.parametrize("world_size", [3, 5])
def test_a_reduce_that_drops_ranks_beyond_a_power_of_two_shows_at_odd_sizes(
    world_size: int,
) -> None:
    for op in OPS:
        cases = [case for case in _tensor_reduces(world_size) if case.reduction == op]
        assert _caught(cases, _first_ranks), f"{op} passes at {world_size} ranks"


def _moved(case: BroadcastCase | AllGatherCase, carrier: str) -> list[Outcome]:
    specs = case.objects if isinstance(case, BroadcastCase) else case.inputs
    tensors = [materialize(spec, _CPU) for spec in specs if isinstance(spec, TensorSpec)]
    back = [t.to(getattr(torch, carrier)).to(t.dtype) for t in tensors]
    if isinstance(case, BroadcastCase):
        result = describe_tensor(back[case.src])
        return [Outcome(rank, result=result) for rank in range(len(specs))]
    result = describe_tensor(torch.stack(back))
    return [Outcome(rank, result=result) for rank in range(len(specs))]


_LOSSY: Final = [
    (dtype, carrier)
    for carriers_of in (_INT_CARRIERS, _FLOAT_CARRIERS)
    for dtype, carriers in carriers_of.items()
    for carrier in carriers
    if (dtype, carrier) not in _REINTERPRETED  # the same bits arrive: nothing is lost
]
"""Each dtype and a carrier that moves it with a loss."""


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize(("dtype", "carrier"), _LOSSY)
def test_broadcast_and_all_gather_through_a_narrower_dtype_show_for_every_dtype(
    world_size: int, dtype: str, carrier: str
) -> None:
    for cases in (broadcast_grid(world_size), all_gather_grid(world_size)):
        moving = [
            case
            for case in cases
            if isinstance(case, BroadcastCase | AllGatherCase) and _dtype(case) == dtype
        ]
        assert moving, f"no {dtype} example"
        assert any(check(case, _moved(case, dtype), ["cpu"] * 5) == [] for case in moving)
        assert any(check(case, _moved(case, carrier), ["cpu"] * 5) for case in moving), (
            f"{type(moving[0]).__name__} of {dtype} through {carrier} passes at {world_size}"
        )


def _dtype(case: BroadcastCase | AllGatherCase) -> str | None:
    specs = case.objects if isinstance(case, BroadcastCase) else case.inputs
    first = specs[0]
    return first.dtype if isinstance(first, TensorSpec) else None


def _group_outcomes(case: GroupCase, src_as_group_rank: bool) -> list[Outcome]:
    members = case.members
    own = [materialize(spec, _CPU) for spec in case.inputs]
    among = torch.stack([own[rank] for rank in members])
    reduced = describe_tensor(_right(case.reduction, among))
    gathered = describe_tensor(among)
    outcomes = []
    for rank in range(len(case.inputs)):
        if rank not in members:
            outcomes.append(Outcome(rank, error=_value_error()))
            continue
        sender = case.src
        if src_as_group_rank:  # the global src read as a place in the group
            if case.src >= len(members):
                outcomes.append(Outcome(rank, error=_value_error()))
                continue
            sender = members[case.src]
        result = (reduced, gathered, describe_tensor(own[sender]))
        outcomes.append(Outcome(rank, result=result))
    return outcomes


def _value_error() -> RaisedError:
    return RaisedError("ValueError", frozenset({"ValueError"}), "not a member", "")


@pytest.mark.parametrize("world_size", WORLD_SIZES[1:])
def test_a_src_read_as_a_group_rank_shows_on_the_grid_at_every_world_size(
    world_size: int,
) -> None:
    groups = [case for case in sub_group_grid(world_size) if isinstance(case, GroupCase)]
    devices = ["cpu"] * world_size
    for case in groups:
        right = _group_outcomes(case, src_as_group_rank=False)
        assert check(case, right, devices) == [], case
    assert any(
        check(case, _group_outcomes(case, src_as_group_rank=True), devices) for case in groups
    )
    # Every member of every renumbered group sends once.
    for case in groups:
        renumbered = case.members != tuple(range(len(case.members)))
        sources = {other.src for other in groups if other.members == case.members}
        assert sources == (set(case.members) if renumbered else {case.members[-1]})


@pytest.mark.parametrize("world_size", WORLD_SIZES[1:])
def test_every_integer_mean_on_the_grid_is_not_a_whole_number(world_size: int) -> None:
    # Wherever the grid takes a mean of integers over two ranks or more, some element
    # of it is not whole, per dtype: the stronger form of the truncation audit.
    for case in _tensor_reduces(world_size):
        spec = case.inputs[0]
        assert isinstance(spec, TensorSpec)
        if case.reduction != "mean" or spec.dtype not in INT_DTYPES or not spec.values:
            continue
        columns = zip(*(s.values for s in case.inputs if isinstance(s, TensorSpec)), strict=True)
        assert any(sum(column) % world_size for column in columns), case


def test_the_audit_covers_every_dtype_the_grid_holds() -> None:
    audited = {*_INT_CARRIERS, *_FLOAT_CARRIERS}
    held = {*INT_DTYPES, *FLOAT_DTYPES, *COMPLEX_DTYPES} - {"complex64"}
    # complex64 has no narrower complex dtype to slip to.
    assert audited == held


Transport = Callable[[int, Message, Sequence[Message]], torch.Tensor]
"""What a rank receives: ``(rank, a message to it, every message of the case) -> tensor``."""


def _delivered(case: PointToPointCase, world_size: int, transport: Transport) -> list[Outcome]:
    return [
        Outcome(
            rank,
            result=tuple(
                describe_tensor(transport(rank, message, case.messages))
                for message in case.messages
                if message.dst == rank
            ),
        )
        for rank in range(world_size)
    ]


def _p2p_caught(world_size: int, transport: Transport) -> list[PointToPointCase]:
    cases = [case for case in point_to_point_grid(world_size) if isinstance(case, PointToPointCase)]
    return [
        case
        for case in cases
        if check(case, _delivered(case, world_size, transport), ["cpu"] * world_size)
    ]


def _whole(rank: int, message: Message, messages: Sequence[Message]) -> torch.Tensor:
    del rank, messages
    return materialize(message.tensor, _CPU)


def _from_the_first_sender(
    rank: int, message: Message, messages: Sequence[Message]
) -> torch.Tensor:
    # Receives match any sender: each takes the first message posted to it of its shape.
    first = next(
        other
        for other in messages
        if other.dst == rank
        and other.tensor.shape == message.tensor.shape
        and other.tensor.dtype == message.tensor.dtype
    )
    return materialize(first.tensor, _CPU)


def _last_posted_first(rank: int, message: Message, messages: Sequence[Message]) -> torch.Tensor:
    # Messages between one pair cross: each receive gets another one's tensor.
    same = [other for other in messages if other.dst == rank and other.src == message.src]
    return materialize(same[len(same) - 1 - same.index(message)].tensor, _CPU)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_whole_messages_pass_every_point_to_point_example_of_the_grid(world_size: int) -> None:
    assert _p2p_caught(world_size, _whole) == []
    assert bool(point_to_point_grid(world_size)) == (world_size > 1)


@pytest.mark.parametrize("world_size", WORLD_SIZES[2:])
def test_a_receive_that_takes_any_sender_shows_where_one_rank_hears_from_several(
    world_size: int,
) -> None:
    # Every rank sending to every other: each hears from two ranks or more.
    assert _p2p_caught(world_size, _from_the_first_sender)


@pytest.mark.parametrize("world_size", WORLD_SIZES[1:])
def test_two_messages_between_one_pair_delivered_out_of_order_show(world_size: int) -> None:
    caught = _p2p_caught(world_size, _last_posted_first)
    # Among them the messages alike in dtype and shape: a transport that matches by
    # size alone crosses them too.
    assert any(
        len({(m.tensor.dtype, m.tensor.shape) for m in case.messages}) == 1 for case in caught
    )


@pytest.mark.parametrize("world_size", WORLD_SIZES[1:])
@pytest.mark.parametrize(("dtype", "carrier"), _LOSSY)
def test_a_message_moved_through_a_narrower_dtype_shows_for_every_dtype(
    world_size: int, dtype: str, carrier: str
) -> None:
    def through(rank: int, message: Message, messages: Sequence[Message]) -> torch.Tensor:
        del rank, messages
        sent = materialize(message.tensor, _CPU)
        return (
            sent.to(getattr(torch, carrier)).to(sent.dtype)
            if message.tensor.dtype == dtype
            else sent
        )

    assert _p2p_caught(world_size, through), f"{dtype} through {carrier} passes"
