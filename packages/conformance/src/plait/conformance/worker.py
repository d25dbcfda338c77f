"""One rank of a pool: builds the strategy once, then runs every example it is sent.

The rank reads its place from the variables torchrun sets, builds the strategy,
joins the process group, and answers each ``(sequence, case)`` message with an
`Outcome`. A second thread answers requests for the stacks of every thread, so
that a rank stuck in a collective can still say where it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import pickle
import signal
import sys
import threading
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import torch
import torch.distributed as dist

from plait.conformance.cases import (
    AllGatherCase,
    BadArgumentCase,
    BarrierTimeoutCase,
    BroadcastCase,
    Case,
    GroupCase,
    MismatchCase,
    ReduceCase,
    TensorSpec,
    TrainingCase,
)
from plait.conformance.mesh import MeshLayout
from plait.conformance.outcomes import Outcome, RaisedError, TensorData
from plait.core import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ConfigurationError,
    PeerFailedError,
    PlaitError,
    ReduceOp,
    TrainingSemantics,
    training_semantics_of,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from plait.conformance.target import StrategyTarget
    from plait.core import Strategy
    from plait.core.typing import ReduceOpLike

__all__ = [
    "THEN_REDUCE",
    "WorkerReport",
    "describe_tensor",
    "invoke",
    "main",
    "materialize",
    "raised",
    "reduce_op",
    "run_case",
]

_KINDS: Final[tuple[type[BaseException], ...]] = (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    PeerFailedError,
    CollectiveError,
    ConfigurationError,
    PlaitError,
    TypeError,
    ValueError,
)

_PR_SET_PDEATHSIG: Final = 1
_MULTIPROCESSING: Final = "multiprocessing"  # the process machinery: not where a rank waits


@attrs.frozen
class WorkerReport:
    """What a rank reports once its strategy has joined the process group."""

    rank: int
    world_size: int
    global_rank: int
    root_device: str
    pid: int
    mesh: MeshLayout | None = None
    semantics: TrainingSemantics = attrs.field(factory=TrainingSemantics)


def materialize(spec: TensorSpec, device: torch.device) -> torch.Tensor:
    """Build the tensor ``spec`` describes on ``device``, in its layout."""
    dtype: torch.dtype = getattr(torch, spec.dtype)
    logical = torch.tensor(spec.values, dtype=dtype, device=device).reshape(spec.shape)
    if spec.layout == "transposed":
        return logical.transpose(-1, -2).contiguous().transpose(-1, -2)
    if spec.layout == "strided":
        wide = torch.zeros((*spec.shape[:-1], 2 * spec.shape[-1]), dtype=dtype, device=device)
        wide[..., ::2] = logical
        return wide[..., ::2]
    return logical


def describe_tensor(tensor: torch.Tensor) -> TensorData:
    """A tensor as data, to send back to the harness."""
    values = tensor.detach().cpu().reshape(-1).tolist()
    return TensorData(
        dtype=str(tensor.dtype).removeprefix("torch."),
        shape=tuple(tensor.shape),
        device=str(tensor.device),
        values=tuple(values),
    )


def raised(error: BaseException) -> RaisedError:
    """An exception as data, with the contract's error kinds it belongs to."""
    calls = None
    missing = None
    if isinstance(error, CollectiveMismatchError):
        calls = tuple((rank, call.describe()) for rank, call in error.calls.items())
    if isinstance(error, CollectiveTimeoutError):
        missing = tuple(error.missing_ranks)
    return RaisedError(
        type_name=type(error).__name__,
        kinds=frozenset(kind.__name__ for kind in _KINDS if isinstance(error, kind)),
        message=str(error),
        traceback="".join(traceback.format_exception(error)),
        calls=calls,
        missing_ranks=missing,
    )


@attrs.define
class _Context:
    """A rank's place in the examples: over the world, or over a mesh dimension's group.

    Over a dimension (``dimension`` set), ``rank`` and ``world_size`` are the rank's
    place in its group and the group's size, as the examples number them; every
    collective names the dimension as its ``group``, and ``members`` are the global
    ranks of the group, in its order.
    """

    strategy: Strategy
    rank: int
    device: torch.device
    evidence: dist.Store
    target: StrategyTarget | None = None
    world_size: int = 1
    sequence: int = 0
    groups: dict[tuple[int, ...], dist.ProcessGroup] = attrs.field(factory=dict)
    global_rank: int = 0
    global_size: int = 1
    layout: MeshLayout | None = None
    dimension: str | None = None
    members: tuple[int, ...] = ()
    along: tuple[tuple[int, ...], ...] = ()

    def place(self, dimension: str | None) -> None:
        """Take this rank's place over the world, or along ``dimension`` of the mesh."""
        self.dimension = dimension
        if dimension is None:
            self.along = (tuple(range(self.global_size)),)
        else:
            if self.layout is None:
                raise ConfigurationError(
                    f"an example over the mesh dimension {dimension!r} came to a pool "
                    "whose strategy was built without a mesh",
                    fix="start the pool with mesh=(...)",
                )
            self.along = self.layout.groups(dimension)
        self.members = next(group for group in self.along if self.global_rank in group)
        self.rank = self.members.index(self.global_rank)
        self.world_size = len(self.members)

    @property
    def key(self) -> str:
        """What tells this rank's group apart in the evidence store's keys."""
        return f"{self.sequence}/{self.members[0]}"

    def group(self, members: tuple[int, ...]) -> dist.ProcessGroup:
        """The process group of the ranks at places ``members`` of this rank's group.

        Every rank makes every group, in the same order: the ranks run the same
        examples. Over a dimension, the group at those places in each of its groups.
        """
        if not dist.is_initialized():
            raise RuntimeError(
                "the strategy did not initialise torch.distributed, so no process group "
                "of some of its ranks can be made for group="
            )
        mine: dist.ProcessGroup | None = None
        for group in self.along:
            ranks = tuple(group[place] for place in members)
            found = self.groups.get(ranks)
            if found is None:
                found = dist.new_group(list(ranks))
                self.groups[ranks] = found
            if group == self.members:
                mine = found
        assert mine is not None
        return mine


def reduce_op(spelling: str) -> ReduceOpLike:
    """What a rank passes as ``reduce_op`` for a spelling of `OP_SPELLINGS`.

    ``"plait.core.ReduceOp.MEAN"`` and ``"torch.distributed.ReduceOp.AVG"`` become
    those enum members; every other spelling is passed as the string it is.
    """
    plait_prefix, torch_prefix = "plait.core.ReduceOp.", "torch.distributed.ReduceOp."
    if spelling.startswith(plait_prefix):
        return ReduceOp[spelling.removeprefix(plait_prefix)]
    if spelling.startswith(torch_prefix):
        member: ReduceOpLike = getattr(dist.ReduceOp, spelling.removeprefix(torch_prefix))
        return member
    return spelling


def _argument(value: object, device: torch.device) -> object:
    return materialize(value, device) if isinstance(value, TensorSpec) else value


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


def _src(context: _Context, src: int) -> int:
    # The global rank at place ``src`` of this rank's group; a place outside it as is.
    return context.members[src] if 0 <= src < context.world_size else src


@functools.singledispatch
def invoke(case: object, context: _Context, argument: object) -> tuple[object, int | None]:
    """What a rank runs for ``case``: the result, and for a barrier how many ranks had entered.

    Each kind of example registers its own (`plait.conformance.kinds`).
    """
    raise TypeError(f"no rank part for {type(case).__name__}")


def _invoke(context: _Context, case: Case, argument: object) -> tuple[object, int | None]:
    return invoke(case, context, argument)


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


_WRITES: Final = (ReduceCase, BroadcastCase, AllGatherCase, GroupCase)
"""Examples whose tensor results are written to afterwards: results are the caller's own."""


def _write_results(
    context: _Context, argument: object, result: object, *, share_check: bool
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


def run_case(context: _Context, case: Case) -> Outcome:
    """Run this rank's part of ``case`` and report what happened."""
    rank = context.rank
    if isinstance(case, BarrierTimeoutCase) and case.absent_rank == rank:
        return Outcome(rank)
    if isinstance(case, TrainingCase):
        return _train(context, case)
    argument: object = None
    if isinstance(case, ReduceCase | AllGatherCase | GroupCase):
        argument = _argument(case.inputs[rank], context.device)
    elif isinstance(case, BroadcastCase):
        argument = _argument(case.objects[rank], context.device)
    before = _snapshot(argument)
    try:
        result, entered = _invoke(context, case, argument)
    except Exception as error:  # noqa: BLE001 - every error is reported, not raised
        outcome = Outcome(rank, error=raised(error), mutated=_changed(before, argument))
        result = None
    else:
        outcome = Outcome(
            rank, result=_result(result), mutated=_changed(before, argument), entered=entered
        )
    if isinstance(case, _WRITES):
        # Where one rank's value goes to every rank (broadcast), results shared
        # among the ranks are a slip worth the meeting that shows them.
        share_check = isinstance(case, BroadcastCase)
        aliased = _write_results(context, argument, result, share_check=share_check)
        if aliased is not None:
            outcome = attrs.evolve(outcome, aliased=aliased)
    outsiders = isinstance(case, GroupCase) and len(case.members) < context.world_size
    if isinstance(case, MismatchCase | BadArgumentCase) or outsiders:
        outcome = _then_reduce(context, outcome)
    return outcome


def _train(context: _Context, case: TrainingCase) -> Outcome:
    """Run this rank's part of a training example on fresh strategies of the pool's target."""
    from plait.conformance.training.program import run_training  # noqa: PLC0415 - its lane only

    assert context.target is not None
    try:
        outcome = Outcome(context.rank, result=run_training(context.target, case))
    except Exception as error:  # noqa: BLE001 - every error is reported, not raised
        outcome = Outcome(context.rank, error=raised(error))
    if not dist.is_initialized():
        # A strategy whose teardown leaves the process group (DeepSpeed's engine
        # destroys its groups) ended the pool's too: the pool's strategy joins anew,
        # as a later run of a program would, for the examples that follow.
        context.strategy = context.target.build()
        context.strategy.setup_environment()
        context.groups.clear()
    return outcome


THEN_REDUCE: Final = (MismatchCase, BadArgumentCase, GroupCase)
"""Examples where ranks raise (in a group's, the ranks outside it), after which every
rank runs a plain reduce in the same message: the strategy must still work
(`Outcome.after`)."""


def _then_reduce(context: _Context, outcome: Outcome) -> Outcome:
    mine = torch.tensor([context.rank], dtype=torch.int64, device=context.device)
    try:
        reduced = context.strategy.reduce(mine, group=context.dimension, reduce_op="sum")
    except Exception as error:  # noqa: BLE001 - every error is reported, not raised
        return attrs.evolve(outcome, after_error=raised(error))
    return attrs.evolve(outcome, after=_result(reduced))


def _die_with_parent() -> None:
    # The pool's process may be killed without running its clean-up; its ranks must
    # not outlive it.
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _answer_stack_requests(control: Connection) -> None:
    main_id = threading.main_thread().ident
    while True:
        try:
            control.recv()
        except (EOFError, OSError):
            return
        frames = sys._current_frames()
        parts = []
        for ident, frame in frames.items():
            if ident == threading.get_ident():
                continue
            title = "main thread" if ident == main_id else f"thread {ident}"
            kept = [
                entry
                for entry in traceback.extract_stack(frame)
                if _MULTIPROCESSING not in Path(entry.filename).parts
            ]
            parts.append(f"--- {title} ---\n" + "".join(traceback.format_list(kept)))
        control.send("\n".join(parts))


def main(
    *,
    rank: int,
    environ: dict[str, str],
    target: StrategyTarget,
    tasks: Connection,
    control: Connection,
    evidence_address: tuple[str, int],
) -> None:
    """Run rank ``rank`` until the pool closes ``tasks``."""
    _die_with_parent()
    os.environ.update(environ)
    threading.Thread(target=_answer_stack_requests, args=(control,), daemon=True).start()
    try:
        strategy = target.build()
        strategy.setup_environment()
        layout = MeshLayout.of(strategy, target.mesh) if target.mesh else None
        evidence = dist.TCPStore(*evidence_address, is_master=False, timeout=timedelta(seconds=60))
        tasks.send(
            WorkerReport(
                rank=rank,
                world_size=strategy.world_size,
                global_rank=strategy.global_rank,
                root_device=str(strategy.root_device),
                pid=os.getpid(),
                mesh=layout,
                semantics=training_semantics_of(strategy),
            )
        )
    except BaseException as error:  # noqa: BLE001 - reported to the pool, which fails
        with contextlib.suppress(OSError):
            tasks.send(raised(error))
        return
    context = _Context(
        strategy,
        rank,
        strategy.root_device,
        evidence,
        target,
        global_rank=rank,
        global_size=strategy.world_size,
        layout=layout,
    )
    while True:
        try:
            message = tasks.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        context.sequence, case, dimension = message
        try:
            context.place(dimension)
        except Exception as error:  # noqa: BLE001 - reported as the rank's outcome
            tasks.send(Outcome(rank, error=raised(error)))
            continue
        tasks.send(run_case(context, case))
    with contextlib.suppress(Exception):
        strategy.teardown()
