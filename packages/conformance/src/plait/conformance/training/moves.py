"""Checkpoint moves: a checkpoint saved mid-run goes on, on each strategy declared compatible.

A run is saved mid-way on the source's pool (a `MoveCase` without ``source``), goes
on there, and goes on from the same checkpoint on the target's (the same case with
the checkpoint as its ``source``): `prove_moves`
proves it over the two pools, and the losses must agree within the precision's
rounding. Where the strategy declares itself ``resizable``, its checkpoint also goes
on at other world sizes, on the same strategy's pools there, with the losses of one
process on the global batch of the ranks it goes on with
(`plait.conformance.training.reference.resized_reference`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import torch
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.kind import Property
from plait.conformance.pool import PoolError, PoolStartError, RankPool
from plait.conformance.properties import ContractViolation, drawing, plain
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.training.cases import StoppedCase
from plait.conformance.training.compare import OTHER_ORDER, loss_apart, tolerance
from plait.conformance.training.example import SLOWER, TrainingKind, reports
from plait.conformance.training.generate import (
    declared_period,
    grid_run,
    inside_second_period,
    stopped_run,
)
from plait.conformance.training.loop import (
    FRESH_SEED,
    Loop,
    TrainingReport,
    finish,
    seed_streams,
    shared_directory,
)
from plait.conformance.training.reference import resized_reference

if TYPE_CHECKING:
    from collections.abc import Callable

    from plait.conformance.cases import Case, TrainingRun
    from plait.conformance.target import StrategyTarget
    from plait.core import Strategy, TrainingSemantics

__all__ = [
    "MOVES",
    "MoveCase",
    "MoveViolation",
    "Moves",
    "check_move",
    "check_resized",
    "moves",
    "moves_grid",
    "prove_moves",
    "reproduce_move",
]


@attrs.frozen(hash=False)
class MoveCase(StoppedCase):
    """A run saved after ``stop_at`` steps that goes on, here and where its checkpoint moves.

    Without ``source``, a rank trains to ``stop_at``, saves and goes on (the losses a
    moved checkpoint must go on with); with it, a rank loads ``source`` (as such a
    run saved it) and goes on from ``stop_at``.

    Attributes:
        source: The checkpoint to load and go on from; None: train and save it.
    """

    source: str | None = attrs.field(default=None, kw_only=True)


@st.composite
def _move(draw: st.DrawFn, semantics: TrainingSemantics) -> MoveCase:
    run, stop_at, _ = draw(stopped_run(semantics, inside=False, goes_on=True))
    return MoveCase(run, stop_at=stop_at)


def moves(world_size: int, semantics: TrainingSemantics) -> st.SearchStrategy[MoveCase]:
    """A run saved after some steps that goes on, here and where its checkpoint moves."""
    del world_size
    return _move(semantics)


def moves_grid(world_size: int, semantics: TrainingSemantics) -> list[MoveCase]:
    """The move every run tries first: SGD, saved after its first step, going on for four.

    SGD's steps scale with the gradients, where Adam's would not: a move that scales
    them wrongly shows.
    """
    del world_size
    run = grid_run(semantics)
    period = declared_period(semantics)
    return [MoveCase(run, stop_at=1 if period is None else inside_second_period(period))]


MOVES: Final = Property(
    "checkpoint_moves",
    "a checkpoint saved mid-run, loaded by each strategy the strategy declares compatible "
    "at the same world size, goes on with the losses the strategy itself went on with; "
    "where it declares itself resizable, loaded by the strategy at other world sizes, "
    "it goes on as one process on the global batch of the ranks there",
    draws=moves,
    over_groups=False,
    slower=SLOWER,
)
"""The moves: proved by `prove_moves`, over two pools."""


class Moves(TrainingKind[MoveCase]):
    """Each rank's part of a move: where the checkpoint is saved, or where it goes on."""

    case_type = MoveCase
    properties = (MOVES,)

    @override
    def train(
        self,
        strategy: Strategy,
        target: StrategyTarget,
        case: MoveCase,
        semantics: TrainingSemantics,
    ) -> TrainingReport:
        if case.source is None:
            return _move_out(strategy, case, semantics)
        return _move_in(strategy, case, case.source, semantics)


def _move_out(strategy: Strategy, case: MoveCase, semantics: TrainingSemantics) -> TrainingReport:
    """Train to ``stop_at``, save, and go on: the losses a moved checkpoint must go on with."""
    run = case.run
    seed_streams(run, strategy.global_rank)
    try:
        loop = Loop(strategy, run, model_seed=run.seed)
        loop.begin()
        loop.train(0, case.stop_at)
        directory = shared_directory(strategy, "plait-kit-move-")
        path = str(Path(directory) / "checkpoint")
        strategy.save_checkpoint(loop.state(), path)
        strategy.barrier()
        after = loop.train(case.stop_at, run.steps)
        loop.end()
    finally:
        finish(strategy)
    return TrainingReport(
        semantics,
        losses=tuple(after),
        checkpoint=path,
        data_parallel_size=loop.data_parallel_size,
    )


def _move_in(
    strategy: Strategy, case: MoveCase, source: str, semantics: TrainingSemantics
) -> TrainingReport:
    """Load ``source`` (as `_move_out` saved it) and go on from ``stop_at``."""
    run = case.run
    torch.manual_seed(FRESH_SEED + strategy.global_rank)
    try:
        loop = Loop(strategy, run, model_seed=run.seed + FRESH_SEED)
        loop.restore(source)
        loop.begin()
        after = loop.train(case.stop_at, run.steps)
        loop.end()
    finally:
        finish(strategy)
    return TrainingReport(
        semantics, losses=tuple(after), data_parallel_size=loop.data_parallel_size
    )


def check_move(
    source: str, target: str, expected: Sequence[float], found: Sequence[float], run: TrainingRun
) -> list[str]:
    """How a checkpoint of ``source`` loaded by ``target`` failed to go on with its losses."""
    if len(found) != len(expected):
        return [f"{target} took {len(found)} steps from {source}'s checkpoint, not {len(expected)}"]
    close = tolerance(run.precision, run.optimizer)
    step = loss_apart(expected, found, close, margin=OTHER_ORDER)
    if step is None:
        return []
    return [
        (
            f"{target}, going on from {source}'s checkpoint, has the loss {found[step]:.6g} "
            f"at its step {step}; {source} itself went on with {expected[step]:.6g}"
        )
    ]


class MoveViolation(ContractViolation):
    """A checkpoint moved to a declared-compatible strategy did not go on as it should."""

    def __init__(
        self,
        pool: RankPool,
        case: MoveCase,
        target: str,
        problems: list[str],
        *,
        moved_world_size: int | None = None,
    ) -> None:
        self.moved_to = target
        self.moved_world_size = moved_world_size
        """The world size the checkpoint went on at, where the move resized it."""
        super().__init__(MOVES, pool, case, problems)

    @property
    @override
    def snippet(self) -> str:
        """A script that reruns the move."""
        return "\n".join(
            [
                "from plait.conformance import MoveCase, TrainingRun",
                "from plait.conformance.training import reproduce_move",
                "",
                'if __name__ == "__main__":',
                (
                    f"    reproduce_move({self.strategy!r}, {self.moved_to!r}, {self.case!r}, "
                    f"world_size={self.world_size}"
                    + (f", mesh={self.rerun['mesh']!r}" if self.rerun.get("mesh") else "")
                    + (
                        f", moved_world_size={self.moved_world_size})"
                        if self.moved_world_size is not None
                        else ")"
                    )
                ),
            ]
        )


def check_resized(
    name: str,
    source: int,
    target: int,
    found: Sequence[float],
    case: MoveCase,
    *,
    reading: tuple[int, int] | None = None,
) -> list[str]:
    """How a checkpoint of ``source`` ranks, resumed at ``target`` ranks, failed to go on.

    ``reading``: how many of the ranks read different data, there and here (where a
    tensor-parallel group's ranks read the same); by default, every rank.
    """
    run = case.run
    saved, going_on = (source, target) if reading is None else reading
    expected = resized_reference(run, saved, going_on, case.stop_at).losses[case.stop_at :]
    if len(found) != len(expected):
        return [f"{name} at {target} ranks took {len(found)} steps, not {len(expected)}"]
    batch = (
        f"the {target} ranks"
        if going_on == target
        else f"the {going_on} data-parallel rank{'' if going_on == 1 else 's'}"
    )
    step = loss_apart(expected, found, tolerance(run.precision, run.optimizer), margin=OTHER_ORDER)
    if step is None:
        return []
    return [
        (
            f"{name} at {target} ranks, going on from its checkpoint of {source} ranks (saved "
            f"after {case.stop_at} step{'' if case.stop_at == 1 else 's'}), has the loss "
            f"{found[step]:.6g} at its step {step}; "
            f"one process on the global batch of {batch} from the saved state "
            f"gives {expected[step]:.6g}"
        )
    ]


def _moved(source: RankPool, target: RankPool, case: MoveCase, *, moved_to: str) -> None:
    """Run ``case`` on ``source``, its checkpoint on ``target``; raise where they part.

    A ``target`` of another world size is the same strategy there: a resize.
    """
    resized = target.world_size != source.world_size or target.target.mesh != source.target.mesh
    __tracebackhide__ = True
    try:
        out = source.run(case, deadline=source.deadline * SLOWER)
    except (PoolError, PoolStartError) as error:
        raise MoveViolation(source, case, moved_to, [str(error)]) from None
    kept, problems = reports(out)
    problems += [
        f"rank {outcome.rank} raised {outcome.error.describe()}\n{outcome.error.traceback}"
        for outcome in out
        if outcome.error is not None
    ]
    if problems:
        raise MoveViolation(source, case, moved_to, problems)
    first: TrainingReport = kept[0]
    if first.refused is not None or first.checkpoint is None:
        return
    moved = attrs.evolve(case, source=first.checkpoint)
    try:
        try:
            back = target.run(moved, deadline=target.deadline * SLOWER)
        except (PoolError, PoolStartError) as error:
            raise MoveViolation(source, case, moved_to, [str(error)]) from None
        arrived, problems = reports(back)
        problems += [
            f"{moved_to} rank {outcome.rank} raised {outcome.error.describe()}\n"
            f"{outcome.error.traceback}"
            for outcome in back
            if outcome.error is not None
        ]
        if not problems and arrived[0].refused is None and resized:
            problems = check_resized(
                moved_to,
                source.world_size,
                target.world_size,
                arrived[0].losses,
                case,
                reading=(
                    first.data_parallel(source.world_size),
                    arrived[0].data_parallel(target.world_size),
                ),
            )
        elif not problems and arrived[0].refused is None:
            problems = check_move(
                source.target.name,
                moved_to,
                first.losses,
                arrived[0].losses,
                case.run,
            )
        if problems:
            raise MoveViolation(
                source,
                case,
                moved_to,
                problems,
                moved_world_size=target.world_size if resized else None,
            )
    finally:
        shutil.rmtree(Path(first.checkpoint).parent, ignore_errors=True)


def prove_moves(
    source: RankPool,
    target_pool: Callable[[str], RankPool],
    *,
    max_examples: int,
    shrink: bool = True,
    seed: int | None = None,
    resized_pool: Callable[[int], RankPool] | None = None,
    resize_to: Sequence[int] = (),
) -> int:
    """Prove that ``source``'s checkpoints move to each strategy it declares compatible.

    ``target_pool(name)`` gives the running pool of a compatible strategy at
    ``source``'s world size and lane. Each drawn run is saved mid-way on ``source``,
    goes on there, and goes on from the same checkpoint on the target: the losses
    must agree within the precision's rounding. Where the strategy declares itself
    ``resizable``, ``resized_pool(world_size)`` gives its own pool at each world size
    of ``resize_to`` besides ``source``'s, where the checkpoint goes on with the losses
    of one process on the global batch of those ranks.

    Returns:
        How many examples ran, over every compatible strategy and world size.

    Raises:
        MoveViolation: A move did not go on as it should.
    """
    __tracebackhide__ = True
    source.start()
    count = sum(
        _prove_move(
            source, target_pool(name), name, max_examples=max_examples, shrink=shrink, seed=seed
        )
        for name in source.semantics.compatible
    )
    if not source.semantics.resizable or resized_pool is None:
        return count
    return count + sum(
        _prove_move(
            source,
            resized_pool(size),
            source.target.name,
            max_examples=max_examples,
            shrink=shrink,
            seed=seed,
        )
        for size in resize_to
        if size != source.world_size
    )


def _prove_move(
    source: RankPool,
    target: RankPool,
    name: str,
    *,
    max_examples: int,
    shrink: bool,
    seed: int | None,
) -> int:
    __tracebackhide__ = True
    count = 0

    grid = moves_grid(source.world_size, source.semantics)

    def run(case: Case) -> None:
        nonlocal count
        assert isinstance(case, MoveCase)
        count += 1
        try:
            _moved(source, target, case, moved_to=name)
        except MoveViolation as violation:
            violation.locate(seed=seed, explicit=case in grid)
            violation.examples = count
            raise

    # The grid first, in every run, as `prove` runs a property's.
    try:
        for case in grid:
            run(case)
    except MoveViolation as violation:
        raise plain(violation) from None
    test = drawing(
        run,
        moves(source.world_size, source.semantics),
        limit=max_examples,
        shrink=shrink,
        seed=seed,
    )
    try:
        test()
    except MoveViolation as violation:
        raise plain(violation) from None
    return count


def reproduce_move(
    source: str,
    target: str,
    case: MoveCase,
    *,
    world_size: int,
    backend: str = "gloo",
    mesh: tuple[int, ...] = (),
    moved_world_size: int | None = None,
) -> None:
    """Rerun one move, as a failure report prints it (under ``if __name__ == "__main__":``).

    ``mesh``: the mesh ``source`` is built on (its factory's ``mesh_shape``). With
    ``moved_world_size``, the checkpoint goes on at that world size (a resize), on
    the strategy's own mesh there.

    Raises:
        MoveViolation: The move still does not go on as it should.
    """
    size = world_size if moved_world_size is None else moved_world_size
    with (
        RankPool(source, world_size=world_size, backend=backend, mesh=mesh) as there,
        RankPool(target, world_size=size, backend=backend) as here,
    ):
        _moved(there, here, case, moved_to=target)


EXAMPLE_KINDS.register(Moves())
