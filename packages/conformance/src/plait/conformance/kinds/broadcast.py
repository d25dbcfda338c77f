"""``broadcast``: every rank gets a value equal to ``src``'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from typing_extensions import override

from plait.conformance import generate, grid
from plait.conformance.cases import BroadcastCase, TensorSpec
from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import same_object, show, tensor_problem

if TYPE_CHECKING:
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = ["BROADCAST", "BroadcastKind"]

BROADCAST: Final = Property(
    "broadcast",
    "broadcast(obj, src) gives every rank a value equal to src's: tensors of any "
    "dtype, shape and layout on the rank's root_device, and any picklable object",
    generate.broadcast_cases,
    grid=grid.broadcast,
)


class BroadcastKind(CollectiveKind[BroadcastCase]):
    """Every rank calls ``broadcast(objects[rank], src)``."""

    case_type = BroadcastCase
    properties = (BROADCAST,)
    writes_results = True
    # One rank's value goes to every rank: results shared among the ranks are a
    # slip worth the meeting that shows them.
    shares_results = True
    snippet_names = ("Call", "TensorSpec")

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
