"""``all_gather``: row i of every rank's result is rank i's tensor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import torch

from plait.conformance.cases import AllGatherCase, TensorSpec
from plait.conformance.outcomes import Outcome, TensorData, shown
from plait.conformance.spec import _check_case, _check_tensor_equal
from plait.conformance.worker import _Context, invoke

__all__: list[str] = []


@invoke.register(AllGatherCase)
def _invoke_all_gather(
    case: AllGatherCase, context: _Context, argument: object
) -> tuple[object, None]:
    strategy = context.strategy
    group = context.dimension
    assert isinstance(argument, torch.Tensor)
    return strategy.all_gather(argument, group=group), None


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


@_check_case.register(AllGatherCase)
def _check_all_gather(
    case: AllGatherCase, outcomes: Sequence[Outcome], devices: Sequence[str]
) -> list[str]:
    first = case.inputs[0]
    shape = (len(case.inputs), *first.shape)
    values = tuple(value for spec in case.inputs for value in spec.values)
    problems = []
    for outcome in outcomes:
        result = outcome.result
        problem = _check_tensor_equal(
            result,
            first,
            rank=outcome.rank,
            shape=shape,
            values=values,
            device=devices[outcome.rank],
        )
        comparable = (
            isinstance(result, TensorData)
            and result.shape == shape
            and result.dtype == first.dtype
            and result.device == devices[outcome.rank]
        )
        if problem and comparable:
            problem = _rows_problem(outcome.rank, result, case.inputs)  # type: ignore[arg-type]
        if problem:
            problems.append(problem)
    return problems
