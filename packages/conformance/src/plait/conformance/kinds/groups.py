"""Sub-groups: the contract among a group's ranks, and outsiders refused at once."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
import torch
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.cases import OP_SPELLINGS, OPS, TensorSpec, op_of, spellings_of
from plait.conformance.generate import dtypes_for, shapes, tensor_specs
from plait.conformance.grid import per_rank
from plait.conformance.kind import Property
from plait.conformance.kinds.all_gather import ALL_GATHER, AllGatherCase
from plait.conformance.kinds.broadcast import BROADCAST, BroadcastCase
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.kinds.reduce import REDUCE_TENSORS, ReduceCase, op_labels
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import show
from plait.conformance.worker import reduce_op

if TYPE_CHECKING:
    from plait.conformance.cases import Case
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = ["SUB_GROUPS", "GroupCase", "GroupKind", "failing_parts", "group_cases", "sub_group_grid"]


@attrs.frozen
class GroupCase:
    """The ranks of ``members`` collect over a process group of just them.

    Every rank makes the group (``torch.distributed.new_group(members)``). Each member
    calls ``reduce(inputs[rank], group, op)``, ``all_gather(inputs[rank], group)`` and
    ``broadcast(inputs[rank], src, group)``; each other rank calls ``reduce`` with the
    group, which must raise ``ValueError`` at once (not hang, not reduce).
    """

    members: tuple[int, ...]
    op: str = attrs.field(validator=attrs.validators.in_(OP_SPELLINGS))
    src: int
    inputs: tuple[TensorSpec, ...]

    @property
    def reduction(self) -> str:
        """The reduction ``op`` names, as one of `OPS`."""
        return op_of(self.op)

    def __attrs_post_init__(self) -> None:
        if not self.members or list(self.members) != sorted(set(self.members)):
            raise ValueError(f"members {self.members} must be distinct ranks in order")
        if self.src not in self.members:
            raise ValueError(f"src {self.src} is not one of the members {self.members}")


@st.composite
def group_cases(draw: st.DrawFn, world_size: int) -> GroupCase:
    """Some ranks (at least one) collect over a group of just them; the others stay out."""
    members = tuple(
        sorted(
            draw(
                st.sets(st.integers(0, world_size - 1), min_size=1, max_size=world_size),
                label="members",
            )
        )
    )
    op = draw(st.sampled_from(OPS), label="op")
    spelling = draw(st.sampled_from(spellings_of(op)), label="spelling")
    src = draw(st.sampled_from(members), label="src")
    dtype = draw(st.sampled_from(dtypes_for(op)), label="dtype")
    specs = tensor_specs(dtype, draw(shapes(), label="shape"), op=op, world_size=world_size)
    return GroupCase(members, spelling, src, tuple(draw(specs) for _ in range(world_size)))


_MAX_GROUPS: Final = 31


def _group_inputs(
    members: tuple[int, ...], dtype: str, op: str, world_size: int
) -> tuple[TensorSpec, ...]:
    # The members hold what a job of their size would (an integer mean over them is
    # never whole); the ranks outside hold values of their own, which must not count.
    among = per_rank(dtype, op, len(members))
    outside = per_rank(dtype, op, world_size)
    return tuple(
        among[members.index(rank)] if rank in members else outside[rank]
        for rank in range(world_size)
    )


def sub_group_grid(world_size: int) -> list[Case]:
    """Every group of some ranks, the ops and dtypes in turn.

    ``src`` is the group's last member and, where the group numbers its ranks
    otherwise than the job does, every member in turn. Above five ranks, the groups
    of one, two, all but one and all ranks.
    """
    cases: list[Case] = []
    ops = itertools.cycle(OPS)
    dtypes = itertools.cycle(("float64", "int64", "float32", "int32"))
    sizes = list(range(1, world_size + 1))
    if 2**world_size - 1 > _MAX_GROUPS:  # the smallest and the largest groups only
        sizes = sorted({1, 2, world_size - 1, world_size})
    for size in sizes:
        for members in itertools.combinations(range(world_size), size):
            op, dtype = next(ops), next(dtypes)
            inputs = _group_inputs(members, dtype, op, world_size)
            renumbered = members != tuple(range(size))
            # A src read as a group rank where a global one is meant (or the reverse)
            # shows only where the two differ: there, every member sends once.
            sources = members if renumbered else members[-1:]
            cases += [GroupCase(members, op, src, inputs) for src in sources]
    return cases


SUB_GROUPS: Final = Property(
    "sub_groups",
    "over a process group of some ranks, reduce, all_gather and broadcast keep the "
    "contract among its ranks (their inputs only, rows in their order, src a global "
    "rank), and a rank outside the group that calls with it raises ValueError",
    group_cases,
    grid=sub_group_grid,
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
    snippet_names = ("TensorSpec",)

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
