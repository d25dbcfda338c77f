"""Mismatched calls: every rank raises `CollectiveMismatchError` naming each rank's call."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.cases import OPS, TensorSpec
from plait.conformance.generate import shapes
from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import show
from plait.conformance.worker import materialize

if TYPE_CHECKING:
    from plait.conformance.cases import Case
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = [
    "MISMATCH",
    "MISMATCH_DTYPES",
    "Call",
    "MismatchCase",
    "MismatchKind",
    "mismatch_cases",
    "mismatch_grid",
]


@attrs.frozen
class Call:
    """One rank's call in a `MismatchCase`: a collective and its arguments.

    ``tensor`` is the tensor argument (``reduce``, ``all_gather``, ``broadcast``);
    ``arg`` the other one: the op of ``reduce``, the ``src`` of ``broadcast``, the
    name of ``barrier``, ``all`` of ``reduce_boolean_decision``.
    """

    collective: str = attrs.field(
        validator=attrs.validators.in_(
            ("reduce", "broadcast", "barrier", "all_gather", "reduce_boolean_decision")
        )
    )
    tensor: TensorSpec | None = None
    arg: object = None


@attrs.frozen
class MismatchCase:
    """The ranks make calls that do not match: every rank must raise, none may hang."""

    calls: tuple[Call, ...]


MISMATCH_DTYPES: Final = ("float32", "float64", "int32", "int64")


def _zeros(dtype: str, shape: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(dtype, shape, (False if dtype == "bool" else 0,) * math.prod(shape))


_COLLECTIVES: Final = ("reduce", "all_gather", "broadcast", "barrier", "reduce_boolean_decision")


def _drawn_call(draw: st.DrawFn, collective: str, world_size: int) -> Call:
    tensor = None
    if collective in ("reduce", "all_gather", "broadcast"):
        tensor = _zeros(draw(st.sampled_from(MISMATCH_DTYPES)), draw(shapes(max_dims=2)))
    arg: object = None
    if collective == "reduce":
        arg = draw(st.sampled_from(OPS))
    elif collective == "broadcast":
        arg = draw(st.integers(0, world_size - 1))
    elif collective == "reduce_boolean_decision":
        arg = draw(st.booleans())
    return Call(collective, tensor, arg)


@st.composite
def _calls(draw: st.DrawFn, world_size: int) -> tuple[Call, Call]:
    """A call, and a variant of it that the contract says must not be mixed with it."""
    collective = draw(st.sampled_from(_COLLECTIVES))
    base = _drawn_call(draw, collective, world_size)
    changes = ["collective"]
    if collective in ("reduce", "all_gather"):
        changes += ["shape", "dtype"]
    if collective in ("reduce", "broadcast", "reduce_boolean_decision"):
        changes.append("arg")
    change = draw(st.sampled_from(changes))
    tensor = base.tensor
    if change == "shape":
        assert tensor is not None
        other_shape = draw(shapes(max_dims=2).filter(lambda shape: shape != tensor.shape))
        return base, Call(collective, _zeros(tensor.dtype, other_shape), base.arg)
    if change == "dtype":
        assert tensor is not None
        other = draw(st.sampled_from([d for d in MISMATCH_DTYPES if d != tensor.dtype]))
        return base, Call(collective, _zeros(other, tensor.shape), base.arg)
    if change == "arg":
        if collective == "reduce":
            other_arg: object = draw(st.sampled_from([op for op in OPS if op != base.arg]))
        elif collective == "broadcast":
            other_arg = draw(st.sampled_from([src for src in range(world_size) if src != base.arg]))
        else:
            other_arg = not base.arg
        return base, Call(collective, tensor, other_arg)
    other_collective = draw(st.sampled_from([c for c in _COLLECTIVES if c != collective]))
    return base, _drawn_call(draw, other_collective, world_size)


@st.composite
def mismatch_cases(draw: st.DrawFn, world_size: int) -> MismatchCase:
    """Some ranks (not all, not none) make a call that differs from the others'."""
    if world_size < 2:
        raise ValueError("a mismatch needs two ranks or more")
    base, variant = draw(_calls(world_size), label="calls")
    others = draw(
        st.sets(st.integers(0, world_size - 1), min_size=1, max_size=world_size - 1),
        label="ranks with the variant",
    )
    return MismatchCase(tuple(variant if rank in others else base for rank in range(world_size)))


def _pairs(world_size: int) -> list[tuple[Call, Call]]:
    # A call and a variant of it that must not be mixed with it: every kind of change.
    base_tensor = _zeros(MISMATCH_DTYPES[0], (2,))
    other_shape = _zeros(MISMATCH_DTYPES[0], (3,))
    other_dtype = _zeros(MISMATCH_DTYPES[1], (2,))
    reduce_sum = Call("reduce", base_tensor, "sum")
    gather = Call("all_gather", base_tensor)
    send = Call("broadcast", base_tensor, 0)
    wait = Call("barrier")
    decide = Call("reduce_boolean_decision", None, arg=True)
    return [
        (reduce_sum, gather),
        (reduce_sum, Call("reduce", other_shape, "sum")),
        (reduce_sum, Call("reduce", other_dtype, "sum")),
        (reduce_sum, Call("reduce", base_tensor, "max")),
        (gather, send),
        (gather, Call("all_gather", other_shape)),
        (gather, Call("all_gather", other_dtype)),
        (send, wait),
        (send, Call("broadcast", base_tensor, world_size - 1)),
        (wait, decide),
        (decide, reduce_sum),
        (decide, Call("reduce_boolean_decision", None, arg=False)),
    ]


def mismatch_grid(world_size: int) -> list[Case]:
    """Every kind of mismatch, the variant made by one rank, a different one each time."""
    cases: list[Case] = []
    for index, (base, variant) in enumerate(_pairs(world_size)):
        odd = index % world_size
        calls = tuple(variant if rank == odd else base for rank in range(world_size))
        cases.append(MismatchCase(calls))
    return cases


MISMATCH: Final = Property(
    "mismatch",
    "ranks that disagree on the collective, op, shape, dtype or src all raise "
    "CollectiveMismatchError naming what each rank called, never hang, and the "
    "strategy still works afterwards",
    mismatch_cases,
    grid=mismatch_grid,
    min_world_size=2,
)


class MismatchKind(CollectiveKind[MismatchCase]):
    """The ranks make calls that do not match: every rank must raise, none may hang."""

    case_type = MismatchCase
    properties = (MISMATCH,)
    raises = True
    snippet_names = ("Call", "TensorSpec")

    @override
    def call(self, context: RankContext, case: MismatchCase, argument: object) -> object:
        return _call(context, case.calls[context.rank])

    @override
    def takes_group(self, case: MismatchCase) -> bool:
        return all(call.collective != "reduce_boolean_decision" for call in case.calls)

    @override
    def checks_after(self, case: MismatchCase, world_size: int) -> bool:
        return True

    @override
    def judge(
        self, case: MismatchCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        want = _partition(list(enumerate(case.calls)))
        problems = []
        for outcome in outcomes:
            error = outcome.error
            if error is None or "CollectiveMismatchError" not in error.kinds:
                got = error.describe() if error else f"returned {show(outcome.result)}"
                problems.append(f"rank {outcome.rank}: must raise CollectiveMismatchError, {got}")
                continue
            calls = error.calls or ()
            if sorted(rank for rank, _ in calls) != list(range(len(case.calls))):
                problems.append(
                    f"rank {outcome.rank}: the error names the calls of ranks "
                    f"{sorted(rank for rank, _ in calls)}, not of every rank"
                )
            elif _partition(calls) != want:
                problems.append(
                    f"rank {outcome.rank}: the error groups the ranks as "
                    f"{sorted(sorted(group) for group in _partition(calls))}, but they called "
                    f"{sorted(sorted(group) for group in want)}"
                )
        return problems


def _call(context: RankContext, call: Call) -> object:
    strategy = context.strategy
    group = context.dimension
    tensor = materialize(call.tensor, context.device) if call.tensor is not None else None
    if call.collective == "reduce":
        assert tensor is not None
        return strategy.reduce(tensor, group=group, reduce_op=str(call.arg))
    if call.collective == "all_gather":
        assert tensor is not None
        return strategy.all_gather(tensor, group=group)
    if call.collective == "broadcast":
        src = context.src(int(call.arg))  # type: ignore[call-overload]
        return strategy.broadcast(tensor, src=src, group=group)
    if call.collective == "barrier":
        strategy.barrier(None if call.arg is None else str(call.arg), group=group)
        return None
    return strategy.reduce_boolean_decision(decision=True, all=bool(call.arg))


def _partition(pairs: Sequence[tuple[int, object]]) -> set[frozenset[int]]:
    groups: dict[object, set[int]] = {}
    for rank, key in pairs:
        groups.setdefault(key, set()).add(rank)
    return {frozenset(ranks) for ranks in groups.values()}


EXAMPLE_KINDS.register(MismatchKind())
