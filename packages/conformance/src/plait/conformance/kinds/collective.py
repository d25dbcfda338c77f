"""The collective kinds' shared part: one call per rank, and the contract's checks around it.

`CollectiveKind` is the base of every kind of the collective contract: each rank
makes its input from the example (`CollectiveKind.argument`), calls the strategy
(`CollectiveKind.call`), and reports the result as data, the error it raised, and
whether the call changed its input. Where the results are the caller's own
(`CollectiveKind.writes_results`), each rank writes to them and checks that nothing
else changed; where ranks raise as they should (`ExampleKind.checks_after`), every
rank then runs a plain reduce, which must still work.
"""

from __future__ import annotations

import abc
import pickle
from typing import TYPE_CHECKING, ClassVar, Final

import attrs
import torch
from typing_extensions import override

from plait.conformance.cases import TensorSpec
from plait.conformance.kind import C, ExampleKind
from plait.conformance.outcomes import Outcome
from plait.conformance.worker import describe_tensor, materialize, raised

if TYPE_CHECKING:
    from plait.conformance.kind import RankContext

__all__ = ["CollectiveKind"]


class CollectiveKind(ExampleKind[C]):
    """A kind of example in which each rank makes one call of the strategy's collectives.

    Subclasses say what each rank passes (`argument`) and what it calls (`call`);
    `run` does the rest, as for every collective of the contract.

    Attributes:
        writes_results: The tensor results are the caller's own: each rank writes to
            them afterwards, and neither its input, its other results nor another
            rank's may change.
        shares_results: Every rank writes its results before any rank looks (one
            rank's value goes to every rank, as broadcast's does), so that a result
            shared among the ranks shows too.
    """

    writes_results: ClassVar[bool] = False
    shares_results: ClassVar[bool] = False

    def argument(self, case: C, rank: int) -> object:
        """What rank ``rank`` passes: a `TensorSpec` becomes a tensor on its device.

        ``None`` where the call takes nothing from the example's data (the default).
        """
        del case, rank
        return None

    @abc.abstractmethod
    def call(self, context: RankContext, case: C, argument: object) -> object:
        """This rank's call of the strategy (with ``group=context.dimension``): its result."""

    def entered(self, context: RankContext, case: C) -> int | None:
        """Read right after `call` returns: how many ranks had entered (a barrier's evidence)."""
        del context, case
        return None

    @override
    def run(self, context: RankContext, case: C) -> Outcome:
        """This rank's call, its result as data, and the checks of its input and results."""
        rank = context.rank
        if rank in self.idle_places(case):
            return Outcome(rank)
        given = self.argument(case, rank)
        argument = materialize(given, context.device) if isinstance(given, TensorSpec) else given
        before = _snapshot(argument)
        try:
            result, entered = _invoke(context, self, case, argument)
        except Exception as error:  # noqa: BLE001 - every error is reported, not raised
            outcome = Outcome(rank, error=raised(error), mutated=_changed(before, argument))
            result = None
        else:
            outcome = Outcome(
                rank, result=_result(result), mutated=_changed(before, argument), entered=entered
            )
        if self.writes_results:
            aliased = _write_results(context, argument, result, share_check=self.shares_results)
            if aliased is not None:
                outcome = attrs.evolve(outcome, aliased=aliased)
        if self.checks_after(case, context.world_size):
            outcome = _then_reduce(context, outcome)
        return outcome


def _invoke(
    context: RankContext, kind: CollectiveKind[C], case: C, argument: object
) -> tuple[object, int | None]:
    result = kind.call(context, case, argument)
    return result, kind.entered(context, case)


def _snapshot(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.clone()
    return pickle.dumps(value)


def _changed(before: object, after: object) -> str | None:
    if isinstance(after, torch.Tensor):
        assert isinstance(before, torch.Tensor)
        if not torch.equal(before, after):
            return f"{before.tolist()} became {after.tolist()}"
        return None
    if pickle.dumps(after) != before:
        return f"the object became {after!r}"
    return None


def _result(value: object) -> object:
    if isinstance(value, tuple):
        return tuple(_result(item) for item in value)
    return describe_tensor(value) if isinstance(value, torch.Tensor) else value


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


_HOST_POINTERS: Final = ("cpu", "cuda")
"""Devices whose storages have real addresses to compare; elsewhere the marks decide."""


def _shares_memory(first: torch.Tensor, second: torch.Tensor) -> bool:
    if first.device != second.device or not first.numel() or not second.numel():
        return False
    if first.device.type not in _HOST_POINTERS:
        return False
    try:
        one, two = first.untyped_storage(), second.untyped_storage()
        start, end = one.data_ptr(), one.data_ptr() + one.nbytes()
        return start < two.data_ptr() + two.nbytes() and two.data_ptr() < end
    except (RuntimeError, NotImplementedError):  # a device without host pointers
        return False


def _marked(tensor: torch.Tensor, value: int) -> tuple[torch.Tensor, int | bool]:
    """Where the mark ``value`` goes in ``tensor``, and the mark as the tensor holds it."""
    if tensor.dtype != torch.bool:
        return tensor, value
    if tensor.device.type in _HOST_POINTERS:
        return tensor.view(torch.uint8), value  # a bool's byte holds any small mark
    return tensor, value % 2 == 1  # elsewhere (XLA's predicates) only two values


def _mark(tensor: torch.Tensor, value: int) -> None:
    view, mark = _marked(tensor, value)
    view.fill_(mark)


def _holds(tensor: torch.Tensor, value: int) -> bool:
    view, mark = _marked(tensor, value)
    return bool((view == mark).all())


def _write_results(
    context: RankContext, argument: object, result: object, *, share_check: bool
) -> str | None:
    """Whether the results share memory with the input, each other, or other ranks' results.

    Each result tensor is checked against the input's memory, then written with a
    mark of its own (its rank and place); then each rank checks that its marks are
    intact and its input unchanged. With ``share_check``, every rank writes before
    any rank looks (they meet in the harness's store, not through the strategy), so
    that a result shared with another rank's shows too.
    """
    results = [tensor for tensor in _tensors(result) if tensor.numel()]
    found: str | None = None
    if isinstance(argument, torch.Tensor):
        for index, tensor in enumerate(results):
            if _shares_memory(tensor, argument):
                found = f"its result{_which(results, index)} shares memory with its input tensor"
                break
    before = argument.clone() if isinstance(argument, torch.Tensor) else torch.empty(0)
    marks = []
    for index, tensor in enumerate(results):
        mark = 2 + context.global_rank + context.global_size * index
        try:
            _mark(tensor, mark)
        except RuntimeError as error:
            found = found or f"its result{_which(results, index)} cannot be written: {error}"
            continue
        marks.append((index, tensor, mark))
    if share_check and context.world_size > 1:  # every rank writes before any rank looks
        key = f"results-written/{context.key}"
        if context.evidence.add(key, 1) == context.world_size:
            context.evidence.set(f"{key}/all", "1")
        context.evidence.wait([f"{key}/all"])
    if found is not None:
        return found
    for index, tensor, mark in marks:
        if not _holds(tensor, mark):
            return (
                f"its result{_which(results, index)} changed when another result was "
                "written: results share memory (another rank's, or another of its own)"
            )
    if isinstance(argument, torch.Tensor) and not torch.equal(before, argument):
        return "writing to its result changed its input: they share memory"
    return None


def _which(results: list[torch.Tensor], index: int) -> str:
    return f" {index}" if len(results) > 1 else ""


def _then_reduce(context: RankContext, outcome: Outcome) -> Outcome:
    mine = torch.tensor([context.rank], dtype=torch.int64, device=context.device)
    try:
        reduced = context.strategy.reduce(mine, group=context.dimension, reduce_op="sum")
    except Exception as error:  # noqa: BLE001 - every error is reported, not raised
        return attrs.evolve(outcome, after_error=raised(error))
    return attrs.evolve(outcome, after=_result(reduced))
