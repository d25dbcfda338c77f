"""``all_gather``: row i of every rank's result is rank i's tensor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
import torch
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.cases import DTYPES, TensorSpec
from plait.conformance.generate import shapes, tensor_specs
from plait.conformance.grid import SHAPES_AND_LAYOUTS, per_rank
from plait.conformance.kind import Property
from plait.conformance.kinds.collective import CollectiveKind
from plait.conformance.outcomes import TensorData, shown
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import tensor_problem

if TYPE_CHECKING:
    from plait.conformance.cases import Case
    from plait.conformance.kind import RankContext
    from plait.conformance.outcomes import Outcome

__all__ = ["ALL_GATHER", "AllGatherCase", "AllGatherKind", "all_gather_cases", "all_gather_grid"]


@attrs.frozen
class AllGatherCase:
    """Every rank calls ``all_gather(inputs[rank])``."""

    inputs: tuple[TensorSpec, ...]


@st.composite
def all_gather_cases(draw: st.DrawFn, world_size: int) -> AllGatherCase:
    """Every rank gathers a tensor of one dtype and shape, in any layout."""
    dtype = draw(st.sampled_from(DTYPES), label="dtype")
    specs = tensor_specs(dtype, draw(shapes(), label="shape"))
    return AllGatherCase(tuple(draw(specs) for _ in range(world_size)))


def all_gather_grid(world_size: int) -> list[Case]:
    """Every dtype, and each shape and layout of `SHAPES_AND_LAYOUTS`."""
    cases: list[Case] = [AllGatherCase(per_rank(dtype, None, world_size)) for dtype in DTYPES]
    cases += [
        AllGatherCase(per_rank("float32", None, world_size, shape, layout))
        for shape, layout in SHAPES_AND_LAYOUTS
    ]
    return cases


ALL_GATHER: Final = Property(
    "all_gather",
    "all_gather(t) returns [world_size, *t.shape] whose row i is rank i's tensor, on "
    "every rank, for every dtype and layout",
    all_gather_cases,
    grid=all_gather_grid,
)


class AllGatherKind(CollectiveKind[AllGatherCase]):
    """Every rank calls ``all_gather(inputs[rank])``."""

    case_type = AllGatherCase
    properties = (ALL_GATHER,)
    writes_results = True
    snippet_names = ("TensorSpec",)

    @override
    def argument(self, case: AllGatherCase, rank: int) -> object:
        return case.inputs[rank]

    @override
    def call(self, context: RankContext, case: AllGatherCase, argument: object) -> object:
        assert isinstance(argument, torch.Tensor)
        return context.strategy.all_gather(argument, group=context.dimension)

    @override
    def judge(
        self, case: AllGatherCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        first = case.inputs[0]
        shape = (len(case.inputs), *first.shape)
        values = tuple(value for spec in case.inputs for value in spec.values)
        problems = []
        for outcome in outcomes:
            result = outcome.result
            problem = tensor_problem(
                result,
                first,
                rank=outcome.rank,
                shape=shape,
                values=values,
                device=devices[outcome.rank],
            )
            if (
                problem
                and isinstance(result, TensorData)
                and _comparable(result, first, shape, devices[outcome.rank])
            ):
                problem = _rows_problem(outcome.rank, result, case.inputs)
            if problem:
                problems.append(problem)
        return problems


def _comparable(result: TensorData, first: TensorSpec, shape: tuple[int, ...], device: str) -> bool:
    """Whether the result has the rows' dtype, shape and device: then its rows are compared."""
    return result.shape == shape and result.dtype == first.dtype and result.device == device


_LAYOUT_HINTS: Final = {
    "transposed": (
        "the input is transposed (not contiguous): a gather that reads its storage in "
        "memory order gets its elements out of place; gather tensor.contiguous()"
    ),
    "strided": (
        "the input is strided (every other element of a wider tensor): a gather that "
        "reads its storage, not its elements, gets the wrong ones; gather "
        "tensor.contiguous()"
    ),
}


def _rows_problem(rank: int, got: TensorData, inputs: Sequence[TensorSpec]) -> str:
    """Row by row, what a rank's gathered rows hold against each rank's tensor."""
    first = inputs[0]
    size = len(first.values)
    rows = [got.values[index * size : (index + 1) * size] for index in range(len(inputs))]
    wanted: list[tuple[object, ...]] = [spec.values for spec in inputs]
    layouts = sorted({spec.layout for spec in inputs})
    lines = [
        (
            f"rank {rank}: all_gather of {first.dtype} tensors of shape {first.shape} "
            f"({', '.join(layouts)}): rows that differ from the ranks' tensors:"
        )
    ]
    for index, (row, want) in enumerate(zip(rows, wanted, strict=True)):
        if row != want:
            lines.append(
                f"    row {index}: got {shown(row)}, expected rank {index}'s {shown(want)}"
            )
    holders = [wanted.index(row) if row in wanted else None for row in rows]
    if all(holder is not None for holder in holders) and holders != list(range(len(rows))):
        lines.append(
            f"    every row is some rank's tensor, out of order: rows 0 to {len(rows) - 1} "
            f"hold the tensors of ranks {holders}"
        )
    else:
        hints = [_LAYOUT_HINTS[layout] for layout in layouts if layout in _LAYOUT_HINTS]
        lines += [f"    {hint}" for hint in hints]
    return "\n".join(lines)


EXAMPLE_KINDS.register(AllGatherKind())
