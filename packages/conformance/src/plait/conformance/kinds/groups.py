"""Sub-groups: the contract among a group's ranks, and outsiders refused at once."""

from __future__ import annotations

import torch

from plait.conformance.cases import GroupCase
from plait.conformance.worker import _Context, _src, invoke, reduce_op

__all__: list[str] = []


def _in_group(context: _Context, case: GroupCase, argument: object) -> object:
    strategy = context.strategy
    group = context.group(case.members)
    assert isinstance(argument, torch.Tensor)
    reduced = strategy.reduce(argument, group=group, reduce_op=reduce_op(case.op))
    if context.rank not in case.members:
        return reduced  # a rank outside the group: it must have raised
    gathered = strategy.all_gather(argument, group=group)
    received = strategy.broadcast(argument, src=_src(context, case.src), group=group)
    return reduced, gathered, received


@invoke.register(GroupCase)
def _invoke_group(case: GroupCase, context: _Context, argument: object) -> tuple[object, None]:
    return _in_group(context, case, argument), None
