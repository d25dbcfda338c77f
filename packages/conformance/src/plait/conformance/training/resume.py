"""Exact resumes: a run stopped anywhere, resumed in a fresh strategy, goes on as never stopped.

Each rank compares the losses, its module and the export of the resumed run with
those of the run never stopped, bit for bit where the strategy declares
``exact_resume``, and reports what differs.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import torch
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.kind import Property
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.training.cases import StoppedCase
from plait.conformance.training.compare import (
    close_states,
    compare_vectors,
    loss_apart,
    tolerance,
)
from plait.conformance.training.example import SLOWER, TrainingKind
from plait.conformance.training.generate import (
    checkpoint_ios,
    declared_period,
    grid_run,
    inside_second_period,
    meets_after,
    stopped_run,
)
from plait.conformance.training.loop import (
    FRESH_SEED,
    Loop,
    TrainingReport,
    build_strategy,
    finish,
    seed_streams,
    shared_directory,
)

if TYPE_CHECKING:
    from plait.conformance.target import StrategyTarget
    from plait.conformance.training.cases import TrainingRun
    from plait.core import Strategy, TrainingSemantics

__all__ = ["RESUME_EXACTNESS", "Resume", "ResumeCase", "resume_grid", "resumes"]


@attrs.frozen(hash=False)
class ResumeCase(StoppedCase):
    """A run stopped after ``stop_at`` steps, resumed in a fresh strategy, and compared.

    Attributes:
        stop_inside: Micro-batches of the next window run before the stop.
    """

    stop_inside: int = attrs.field(default=0, kw_only=True)

    @override
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if not 0 <= self.stop_inside < self.run.accumulate:
            raise ValueError(
                f"stop_inside={self.stop_inside} must be below accumulate={self.run.accumulate}"
            )


@st.composite
def _resume(draw: st.DrawFn, semantics: TrainingSemantics) -> ResumeCase:
    run, stop_at, stop_inside = draw(stopped_run(semantics, inside=True, goes_on=True))
    return ResumeCase(
        run, stop_at=stop_at, stop_inside=stop_inside, checkpoint_io=draw(checkpoint_ios())
    )


def resumes(world_size: int, semantics: TrainingSemantics) -> st.SearchStrategy[ResumeCase]:
    """A run stopped inside an epoch (and inside an accumulation window), then resumed."""
    del world_size
    return _resume(semantics)


def resume_grid(world_size: int, semantics: TrainingSemantics) -> list[ResumeCase]:
    """The resumes every run tries first: inside an epoch and an accumulation window.

    With a period: inside the second period, and right after the second meeting.
    """
    del world_size
    run = grid_run(semantics)
    period = declared_period(semantics)
    if period is None:
        return [ResumeCase(run, stop_at=3, stop_inside=1)]
    return [
        ResumeCase(run, stop_at=inside_second_period(period), stop_inside=1),
        ResumeCase(run, stop_at=2 * period),
    ]


RESUME_EXACTNESS: Final = Property(
    "resume_exactness",
    "a run stopped after a drawn step (inside an epoch, and inside an accumulation "
    "window) and resumed from its checkpoint in a fresh strategy gives the losses, "
    "module and export of the run never stopped: bit for bit where the strategy "
    "declares exact_resume",
    draws=resumes,
    declared_grid=resume_grid,
    over_groups=False,
    slower=SLOWER,
)


class Resume(TrainingKind[ResumeCase]):
    """Stop after a drawn step, resume in a fresh strategy, compare with the run never stopped."""

    case_type = ResumeCase
    properties = (RESUME_EXACTNESS,)

    @override
    def train(
        self,
        strategy: Strategy,
        target: StrategyTarget,
        case: ResumeCase,
        semantics: TrainingSemantics,
    ) -> TrainingReport:
        run = case.run
        rank = strategy.global_rank
        directory = shared_directory(strategy, "plait-kit-")
        path = str(Path(directory) / "checkpoint")
        last: Strategy = strategy
        try:
            expected_steps: list[tuple[float, ...]] = []
            expected, expected_replica, expected_export = _never_stopped(
                strategy, run, directory, expected_steps
            )
            # The run stopped after stop_at steps (and stop_inside micro-batches).
            last = stopped_strategy = build_strategy(target, run, case.checkpoint_io)
            seed_streams(run, rank)
            try:
                stopped = Loop(stopped_strategy, run, model_seed=run.seed)
                stopped.begin()
                before = stopped.train(0, case.stop_at)
                if case.stop_inside and case.stop_at < run.steps:
                    stopped.window(case.stop_at, case.stop_inside)
                stopped_strategy.save_checkpoint(stopped.state(), path)
                stopped_strategy.barrier()
            finally:
                finish(stopped_strategy)
            # The same run resumed in a fresh strategy, from a model that starts elsewhere.
            last = resumed_strategy = build_strategy(target, run, case.checkpoint_io)
            # A new run starts once the stopped one has ended (its writes finished).
            resumed_strategy.barrier()
            torch.manual_seed(FRESH_SEED + rank)
            try:
                resumed = Loop(resumed_strategy, run, model_seed=run.seed + FRESH_SEED)
                resumed.restore(path)
                resumed.begin()
                found_steps: list[tuple[float, ...]] = []
                after = resumed.train(case.stop_at, run.steps, found_steps)
                resumed.end()
                found_replica = None if resumed.sharded else resumed.replica()
                found_export = resumed.export(str(Path(directory) / "resumed"))
            finally:
                finish(resumed_strategy)
        finally:
            _remove(last, directory)
        stop = f"stopped after {case.stop_at} steps" + (
            f" and {case.stop_inside} micro-batches of the next window" if case.stop_inside else ""
        )
        exact = semantics.exact_resume
        close = None if exact else tolerance(run.precision, run.optimizer)
        problems = _losses(expected, before + after, stop, close)
        if expected_replica is not None and found_replica is not None:
            problems += compare_vectors(
                expected_replica, found_replica, f"{stop} and resumed, this rank's module", close
            )
        if expected_export is not None and found_export is not None:
            problems += [
                f"{stop} and resumed, the exported module{problem.removeprefix('the value')}"
                for problem in close_states(expected_export, found_export, close=close)
            ]
        if problems:
            # The cause first: where the runs part, and what parting there says.
            problems.insert(
                0,
                _parting(
                    case,
                    semantics,
                    (expected[case.stop_at :], after),
                    (expected_steps[case.stop_at :], found_steps),
                    close,
                ),
            )
        return TrainingReport(semantics, losses=tuple(before + after), problems=tuple(problems))


def _never_stopped(
    strategy: Strategy, run: TrainingRun, directory: str, steps: list[tuple[float, ...]]
) -> tuple[list[float], tuple[float, ...] | None, dict[str, torch.Tensor] | None]:
    """The run's losses, this rank's module and the export, never stopped.

    This rank's module after each step is added to ``steps`` (none where it is sharded).
    """
    seed_streams(run, strategy.global_rank)
    try:
        whole = Loop(strategy, run, model_seed=run.seed)
        whole.begin()
        losses = whole.train(0, run.steps, steps)
        whole.end()
        replica = None if whole.sharded else whole.replica()
        return losses, replica, whole.export(str(Path(directory) / "whole"))
    finally:
        finish(strategy)


def _remove(strategy: Strategy, directory: str) -> None:
    """Rank 0 removes ``directory`` once every rank is done with it."""
    with contextlib.suppress(Exception):
        strategy.barrier()
    if strategy.global_rank == 0:
        shutil.rmtree(directory, ignore_errors=True)


def _losses(
    expected: Sequence[float], found: Sequence[float], stop: str, close: tuple[float, float] | None
) -> list[str]:
    """How the resumed run's losses differ from the run's never stopped (None: bit for bit)."""
    if len(expected) != len(found):
        return [f"{stop} and resumed, the run took {len(found)} steps, not {len(expected)}"]
    step = loss_apart(expected, found, close)
    if step is None:
        return []
    return [
        f"{stop} and resumed, the loss of step {step} is {found[step]!r}, and "
        f"{expected[step]!r} in the run never stopped"
        + (" (bit for bit, as declared)" if close is None else "")
    ]


def _parting(
    case: ResumeCase,
    semantics: TrainingSemantics,
    losses: tuple[Sequence[float], Sequence[float]],
    modules: tuple[Sequence[tuple[float, ...]], Sequence[tuple[float, ...]]],
    close: tuple[float, float] | None,
) -> str:
    """Where the resumed run parts from the run never stopped, and what that says of the cause.

    ``losses`` and ``modules`` hold the steps after the stop: the run never stopped's,
    then the resumed one's (``modules`` empty where the module is sharded).
    """
    expected, found = losses
    first = loss_apart(expected, found, close) if len(expected) == len(found) else 0
    first = len(expected) if first is None else first
    parted = ""
    for index, (want, got) in enumerate(zip(*modules, strict=False)):
        if index > first:
            break
        differing = compare_vectors(want, got, "this rank's module after it", close)
        if differing:
            first, parted = index, differing[0]
            break
    period = declared_period(semantics)
    if first == len(expected):
        return (
            "the resumed run goes on as the run never stopped through its last step and "
            "parts at the end of training"
            + (" (on_train_end's meeting)" if period is not None else "")
            + ": what the strategy keeps for the end of training did not come back as saved"
        )
    step = case.stop_at + first
    meeting = meets_after(semantics, step + 1)
    where = (
        f"the resumed run parts from the run never stopped at step {step}"
        + (" (the first after the resume)" if first == 0 else f" ({first + 1} after the resume)")
        + (f", a meeting of the replicas (every {period} steps)" if meeting else "")
    )
    if meeting and first > 0:
        cause = (
            "it went on alike until that meeting: what the strategy keeps for its "
            "meetings (the anchor, an outer optimizer's momentum, a step count) did not "
            "come back as saved"
        )
    elif meeting:
        cause = (
            "what the checkpoint restores (module, optimizer, scheduler, random streams) "
            "or what the strategy keeps for its meetings (the anchor, an outer "
            "optimizer's momentum, a step count) did not come back as saved"
        )
    elif first == 0:
        cause = (
            "what the checkpoint restores (module, optimizer, scheduler, random streams, "
            "the strategy's own state) did not come back as saved"
        )
    else:
        cause = (
            "state that acts only later in a run (a scheduler, a counter) did not come "
            "back as saved"
        )
    return f"{where}: {cause}" + (f"; {parted}" if parted else "")


EXAMPLE_KINDS.register(Resume())
