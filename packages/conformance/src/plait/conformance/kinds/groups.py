"""Sub-groups: the contract among a group's ranks, and outsiders refused at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
import torch
from typing_extensions import override

from plait.conformance import generate, grid
from plait.conformance.cases import AllGatherCase, BroadcastCase, GroupCase, ReduceCase
from plait.conformance.kind import Property
from plait.conformance.kinds.all_gather import ALL_GATHER
from plait.conformance.kinds.broadcast import BROADCAST
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.kinds.reduce import REDUCE_TENSORS, op_labels
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import show
from plait.conformance.worker import reduce_op

if TYPE_CHECKING:
    from plait.conformance.cases import Case
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = ["SUB_GROUPS", "GroupKind", "failing_parts"]

SUB_GROUPS: Final = Property(
    "sub_groups",
    "over a process group of some ranks, reduce, all_gather and broadcast keep the "
    "contract among its ranks (their inputs only, rows in their order, src a global "
    "rank), and a rank outside the group that calls with it raises ValueError",
    generate.group_cases,
    grid=grid.sub_groups,
    min_world_size=2,
)

_GROUP_PARTS: Final = (REDUCE_TENSORS.name, ALL_GATHER.name, BROADCAST.name)
"""What each member of a sub-group example returns, in order, by the property that
proves that collective over the whole job."""


class GroupKind(CollectiveKind[GroupCase]):
    """The ranks of ``members`` collect over a process group of just them.

    Each member reduces, gathers and broadcasts over the group; each other rank
    calls ``reduce`` with the group, which must raise ``ValueError`` at once.
    """

    case_type = GroupCase
    properties = (SUB_GROUPS,)
    raises = True  # the ranks outside the group
    writes_results = True
    snippet_names = ("Call", "TensorSpec")

    @override
    def argument(self, case: GroupCase, rank: int) -> object:
        return case.inputs[rank]

    @override
    def call(self, context: RankContext, case: GroupCase, argument: object) -> object:
        strategy = context.strategy
        group = context.group(case.members)
        assert isinstance(argument, torch.Tensor)
        reduced = strategy.reduce(argument, group=group, reduce_op=reduce_op(case.op))
        if context.rank not in case.members:
            return reduced  # a rank outside the group: it must have raised
        gathered = strategy.all_gather(argument, group=group)
        received = strategy.broadcast(argument, src=context.src(case.src), group=group)
        return reduced, gathered, received

    @override
    def checks_after(self, case: GroupCase, world_size: int) -> bool:
        return len(case.members) < world_size  # some ranks raised: the outsiders

    @override
    def labels(self, case: GroupCase) -> dict[str, object]:
        return op_labels(case.op, case.reduction)

    @override
    def judge(
        self, case: GroupCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        # Among the members, each collective keeps the contract as over the whole job
        # (the members' inputs only, rows in the members' order); outside, a call with
        # the group is refused.
        problems = []
        for outcome in outcomes:
            error = outcome.error
            if outcome.rank in case.members:
                if error is not None:
                    problems.append(
                        f"rank {outcome.rank} (in the group {list(case.members)}) raised "
                        f"{error.describe()}\n{error.traceback}"
                    )
            elif error is None or "ValueError" not in error.kinds:
                got = error.describe() if error else f"returned {show(outcome.result)}"
                problems.append(
                    f"rank {outcome.rank} is not in the group {list(case.members)}: its "
                    f"reduce over the group must raise ValueError, {got}"
                )
        if problems:
            return problems
        parts = _group_parts(case, outcomes)
        if isinstance(parts, str):
            return [parts]
        within = f" (over the group of ranks {list(case.members)})"
        return [
            problem + within
            for _, example, part in parts
            for problem in _judge(example, part, devices)
        ]

    @override
    def depends_on(
        self, case: GroupCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> tuple[str, ...]:
        return failing_parts(case, outcomes, devices)


def _judge(example: Case, outcomes: Sequence[Outcome], devices: Sequence[str]) -> list[str]:
    return EXAMPLE_KINDS.kind_of(example).judge(example, outcomes, devices)


def _group_parts(
    case: GroupCase, outcomes: Sequence[Outcome]
) -> list[tuple[str, Case, list[Outcome]]] | str:
    """Each collective of a sub-group example as an example of its own among the members.

    For each: the property that proves it over the whole job, the example (the
    members' inputs only), and the members' outcomes of it; or why the members'
    results cannot be split so.
    """
    members = [outcomes[rank] for rank in case.members]
    for outcome in members:
        result = outcome.result
        if not isinstance(result, tuple) or len(result) != len(_GROUP_PARTS):
            return f"rank {outcome.rank}: the worker's results are malformed: {result!r}"
    inputs = tuple(case.inputs[rank] for rank in case.members)
    examples: tuple[Case, ...] = (
        ReduceCase(case.op, inputs),
        AllGatherCase(inputs),
        BroadcastCase(case.src, case.inputs),
    )
    return [
        (
            name,
            example,
            [attrs.evolve(outcome, result=outcome.result[index]) for outcome in members],  # type: ignore[index]
        )
        for index, (name, example) in enumerate(zip(_GROUP_PARTS, examples, strict=True))
    ]


def failing_parts(
    case: GroupCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> tuple[str, ...]:
    """Which collectives of a sub-group example broke the contract, by property.

    Each is named by the property that proves it over the whole job:
    ``reduce_tensors``, ``all_gather``, ``broadcast``. Empty where the example
    failed otherwise (a member raised, or its results are malformed).
    """
    if any(outcomes[rank].error is not None for rank in case.members):
        return ()
    parts = _group_parts(case, outcomes)
    if isinstance(parts, str):
        return ()
    return tuple(name for name, example, part in parts if _judge(example, part, devices))


EXAMPLE_KINDS.register(GroupKind())
