"""``broadcast``: every rank gets a value equal to ``src``'s."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.cases import DTYPES, TensorSpec
from plait.conformance.generate import any_tensor, objects
from plait.conformance.grid import per_rank
from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import same_object, show, tensor_problem

if TYPE_CHECKING:
    from plait.conformance.cases import Case
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = ["BROADCAST", "BroadcastCase", "BroadcastKind", "broadcast_cases", "broadcast_grid"]


@attrs.frozen
class BroadcastCase:
    """Every rank calls ``broadcast(objects[rank], src)``; a tensor is a `TensorSpec`."""

    src: int
    objects: tuple[object, ...]


@st.composite
def broadcast_cases(draw: st.DrawFn, world_size: int) -> BroadcastCase:
    """Each rank holds its own tensor or object; any rank is ``src``."""
    src = draw(st.integers(0, world_size - 1), label="src")
    return BroadcastCase(src, tuple(draw(_broadcast_values()) for _ in range(world_size)))


@functools.cache
def _broadcast_values() -> st.SearchStrategy[object]:
    return any_tensor() | objects()


def broadcast_grid(world_size: int) -> list[Case]:
    """From every ``src``: a non-contiguous tensor, an empty one and an object; every dtype."""
    cases: list[Case] = []
    for src in range(world_size):
        tensors = per_rank("float64", None, world_size, (2, 3), "transposed")
        empty = per_rank("int64", None, world_size, (0,))
        objects = tuple({"rank": rank, "items": [rank, str(rank)]} for rank in range(world_size))
        cases += [
            BroadcastCase(src, tensors),
            BroadcastCase(src, empty),
            BroadcastCase(src, objects),
        ]
    last = world_size - 1
    cases += [BroadcastCase(last, per_rank(dtype, None, world_size)) for dtype in DTYPES]
    cases.append(BroadcastCase(last, per_rank("float32", None, world_size, (3,), "strided")))
    cases.append(BroadcastCase(last, per_rank("int64", None, world_size, ())))
    return cases


BROADCAST: Final = Property(
    "broadcast",
    "broadcast(obj, src) gives every rank a value equal to src's: tensors of any "
    "dtype, shape and layout on the rank's root_device, and any picklable object",
    broadcast_cases,
    grid=broadcast_grid,
)


class BroadcastKind(CollectiveKind[BroadcastCase]):
    """Every rank calls ``broadcast(objects[rank], src)``."""

    case_type = BroadcastCase
    properties = (BROADCAST,)
    writes_results = True
    # One rank's value goes to every rank: results shared among the ranks are a
    # slip worth the meeting that shows them.
    shares_results = True
    snippet_names = ("TensorSpec",)

    @override
    def argument(self, case: BroadcastCase, rank: int) -> object:
        return case.objects[rank]

    @override
    def call(self, context: RankContext, case: BroadcastCase, argument: object) -> object:
        return context.strategy.broadcast(
            argument, src=context.src(case.src), group=context.dimension
        )

    @override
    def judge(
        self, case: BroadcastCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        sent = case.objects[case.src]
        problems = []
        for outcome in outcomes:
            if isinstance(sent, TensorSpec):
                problem = tensor_problem(
                    outcome.result,
                    sent,
                    rank=outcome.rank,
                    shape=sent.shape,
                    values=sent.values,
                    device=devices[outcome.rank],
                )
                if problem:
                    problems.append(problem + f" (broadcast from src={case.src})")
            elif not same_object(outcome.result, sent):
                problems.append(
                    f"rank {outcome.rank}: got {show(outcome.result)}, expected "
                    f"src={case.src}'s {sent!r}"
                )
        return problems


EXAMPLE_KINDS.register(BroadcastKind())
