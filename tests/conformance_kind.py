"""A kind of example of a third party's: one file and a registration.

Ranks centre their values on the mean over the ranks (``x - reduce(x, "mean")``), as
a normalisation layer synchronised over data-parallel ranks does: the centred
values of every rank must sum to zero, each rank's being its own value less the
mean. Nothing in plait.conformance names this kind: the pool runs it, the judge
judges it and a failure's snippet reproduces it through `EXAMPLE_KINDS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import attrs
import torch
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance import EXAMPLE_KINDS, CollectiveKind, Property, RankContext
from plait.conformance.outcomes import Outcome, TensorData


@attrs.frozen
class CentredCase:
    """Each rank centres ``values[rank]`` (float64) on the ranks' mean."""

    values: tuple[float, ...]


def _cases(world_size: int) -> st.SearchStrategy[CentredCase]:
    finite = st.floats(-1e6, 1e6, allow_nan=False)
    return st.builds(CentredCase, st.tuples(*(finite for _ in range(world_size))))


def _grid(world_size: int) -> list[CentredCase]:
    # Values whose sum is not zero: a mean read as a sum moves every rank off.
    return [CentredCase(tuple(float(rank + 1) for rank in range(world_size)))]


CENTRED: Final = Property(
    "centred",
    "x - reduce(x, 'mean') sums to zero over the ranks, each rank's being its own x less the mean",
    _cases,
    grid=_grid,
)


class CentredKind(CollectiveKind[CentredCase]):
    """Every rank computes ``x - reduce(x, "mean")`` of its value."""

    case_type = CentredCase
    properties = (CENTRED,)
    writes_results = True

    @override
    def call(self, context: RankContext, case: CentredCase, argument: object) -> object:
        mine = torch.tensor([case.values[context.rank]], dtype=torch.float64, device=context.device)
        return mine - context.strategy.reduce(mine, group=context.dimension, reduce_op="mean")

    @override
    def judge(
        self, case: CentredCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        mean = math.fsum(case.values) / len(case.values)
        scale = math.fsum(abs(value) for value in case.values) + 1.0
        problems = []
        for outcome in outcomes:
            result = outcome.result
            if not isinstance(result, TensorData) or result.shape != (1,):
                problems.append(f"rank {outcome.rank}: got {result!r}, not one value")
                continue
            (got,) = result.values
            want = case.values[outcome.rank] - mean
            if not isinstance(got, float) or abs(got - want) > 1e-12 * scale:
                problems.append(
                    f"rank {outcome.rank}: centred {case.values[outcome.rank]!r} to {got!r}, "
                    f"not {want!r} (the mean of {list(case.values)} is {mean!r})"
                )
        return problems


EXAMPLE_KINDS.register(CentredKind())
