"""One rank of a pool: builds the strategy once, then runs every example it is sent.

The rank reads its place from the variables torchrun sets, builds the strategy,
joins the process group, and answers each ``(sequence, case)`` message with an
`Outcome`. A second thread answers requests for the stacks of every thread, so
that a rank stuck in a collective can still say where it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import torch
import torch.distributed as dist

from plait.conformance.mesh import MeshLayout
from plait.conformance.outcomes import Outcome, RaisedError, TensorData
from plait.conformance.registry import EXAMPLE_KINDS
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

    from plait.conformance.cases import Case, TensorSpec
    from plait.conformance.target import StrategyTarget
    from plait.core import Strategy
    from plait.core.typing import ReduceOpLike

__all__ = [
    "WorkerReport",
    "describe_tensor",
    "main",
    "materialize",
    "raised",
    "reduce_op",
    "run_case",
]

_ERRORS: Final[tuple[type[BaseException], ...]] = (
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
        kinds=frozenset(kind.__name__ for kind in _ERRORS if isinstance(error, kind)),
        message=str(error),
        traceback="".join(traceback.format_exception(error)),
        calls=calls,
        missing_ranks=missing,
    )


@attrs.define
class _Context:
    """A rank's place in the examples: over the world, or over a mesh dimension's group.

    The `plait.conformance.RankContext` every kind's rank part is given. Over a
    dimension (``dimension`` set), ``rank`` and ``world_size`` are the rank's place in
    its group and the group's size, as the examples number them; every collective
    names the dimension as its ``group``, and ``members`` are the global ranks of the
    group, in its order.
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

    def src(self, place: int) -> int:
        """The global rank at ``place`` of this rank's group; a place outside it as is."""
        return self.members[place] if 0 <= place < self.world_size else place

    def rejoin(self) -> None:
        """Build the pool's strategy anew where a run ended the process group.

        A strategy whose teardown leaves the process group (DeepSpeed's engine
        destroys its groups) ends the pool's too: the pool's strategy joins anew, as
        a later run of a program would, for the examples that follow.
        """
        if dist.is_initialized():
            return
        assert self.target is not None
        self.strategy = self.target.build()
        self.strategy.setup_environment()
        self.groups.clear()

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


def run_case(context: _Context, case: Case) -> Outcome:
    """Run this rank's part of ``case`` (as its kind says) and report what happened.

    A kind that raises (a kind of one's own, say) is reported as the rank's error:
    the rank lives on for the examples that follow.
    """
    try:
        return EXAMPLE_KINDS.kind_of(case).run(context, case)
    except Exception as error:  # noqa: BLE001 - reported as the rank's outcome
        return Outcome(context.rank, error=raised(error))


if not TYPE_CHECKING:  # type checkers flag the name, as they flag any other it lacks

    def __getattr__(name: str) -> object:
        # Names this module no longer holds, for code that read them here.
        if name == "THEN_REDUCE":
            warnings.warn(
                "plait.conformance.worker.THEN_REDUCE is deprecated: a kind says itself "
                "whether every rank runs a plain reduce after its examples; ask "
                "EXAMPLE_KINDS.kind_of(case).checks_after(case, world_size)",
                DeprecationWarning,
                stacklevel=2,
            )
            by_name = {case_type.__name__: case_type for case_type in EXAMPLE_KINDS.case_types()}
            return tuple(by_name[name] for name in ("MismatchCase", "BadArgumentCase", "GroupCase"))
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    # Forked from a server that imported torch before this environment was the rank's,
    # the rank would keep the thread count torch read then (one per core): the
    # variable alone comes too late to reach it.
    if "OMP_NUM_THREADS" in environ:
        torch.set_num_threads(int(environ["OMP_NUM_THREADS"]))
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
