"""The training properties: what a strategy does to training, proved on drawn runs.

Each runs on the same persistent rank pools as the collective contract, one example
at a time: every rank trains the example's run on fresh strategies of the pool's
target (a new process's view), and the harness judges the ranks' reports against
what the strategy declares (`plait.core.TrainingSemantics`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
from typing_extensions import override

from plait.conformance.pool import PoolError, PoolStartError, RankPool
from plait.conformance.properties import ContractViolation, Property, drawing, plain
from plait.conformance.training import generate
from plait.conformance.training.cases import TrainingCase
from plait.conformance.training.reference import check_move, reports

if TYPE_CHECKING:
    from collections.abc import Callable

    from plait.conformance.cases import Case
    from plait.conformance.training.program import TrainingReport

__all__ = [
    "MOVES",
    "TRAINING_PROPERTIES",
    "MoveViolation",
    "prove_moves",
    "reproduce_move",
    "training_property",
]

_SLOWER: Final = 4.0  # a training example runs a few short trainings: 4 deadlines

TRAINING_PROPERTIES: Final = (
    Property(
        "declared_semantics",
        "training at this world size gives what the strategy declares (Synchronous: one "
        "process on the global batch, accumulation in no_sync included; "
        "PeriodicAveraging: replicas on their own data meeting every k steps and at the "
        "end), loss by loss and replica by replica within the precision's rounding, "
        "for every model, optimizer (LBFGS with a closure) and scheduler; the export is "
        "the trained module",
        draws=generate.replicas,
        grid=generate.replicas_grid,
        over_groups=False,
        slower=_SLOWER,
    ),
    Property(
        "checkpoint_round_trip",
        "save_checkpoint then load_checkpoint, with every checkpoint IO the strategy "
        "accepts, restores the module, optimizer, scheduler, every rank's random streams "
        "and a user's Stateful object (int keys, nested containers, tensors) exactly; "
        "then load_checkpoint(path, module) restores the module alone, leaves the "
        "optimizer as it was and gives back the run's entries",
        draws=generate.round_trips,
        grid=generate.round_trip_grid,
        over_groups=False,
        slower=_SLOWER,
    ),
    Property(
        "resume_exactness",
        "a run stopped after a drawn step (inside an epoch, and inside an accumulation "
        "window) and resumed from its checkpoint in a fresh strategy gives the losses, "
        "module and export of the run never stopped: bit for bit where the strategy "
        "declares exact_resume",
        draws=generate.resumes,
        grid=generate.resume_grid,
        over_groups=False,
        slower=_SLOWER,
    ),
)
"""The training properties, in the order the suite runs them."""

MOVES: Final = Property(
    "checkpoint_moves",
    "a checkpoint saved mid-run, loaded by each strategy the strategy declares compatible "
    "at the same world size, goes on with the losses the strategy itself went on with",
    draws=generate.moves,
    over_groups=False,
    slower=_SLOWER,
)
"""The moves: proved by `prove_moves`, over two pools."""

_BY_KIND: Final = {
    "replicas": TRAINING_PROPERTIES[0],
    "round_trip": TRAINING_PROPERTIES[1],
    "resume": TRAINING_PROPERTIES[2],
    "move_out": MOVES,
    "move_in": MOVES,
}


def training_property(case: TrainingCase) -> Property:
    """The training property whose examples look like ``case``."""
    return _BY_KIND[case.kind]


class MoveViolation(ContractViolation):
    """A checkpoint moved to a declared-compatible strategy did not go on as it should."""

    def __init__(
        self, pool: RankPool, case: TrainingCase, target: str, problems: list[str]
    ) -> None:
        self.moved_to = target
        super().__init__(MOVES, pool, case, problems)

    @property
    @override
    def snippet(self) -> str:
        """A script that reruns the move."""
        return "\n".join(
            [
                "from plait.conformance.cases import TrainingCase, TrainingRun",
                "from plait.conformance.training import reproduce_move",
                "",
                'if __name__ == "__main__":',
                (
                    f"    reproduce_move({self.strategy!r}, {self.moved_to!r}, {self.case!r}, "
                    f"world_size={self.world_size})"
                ),
            ]
        )


def _moved(source: RankPool, target: RankPool, case: TrainingCase, *, moved_to: str) -> None:
    """Run ``case`` on ``source``, its checkpoint on ``target``; raise where they part."""
    __tracebackhide__ = True
    try:
        out = source.run(case, deadline=source.deadline * _SLOWER)
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
    moved = attrs.evolve(case, kind="move_in", source=first.checkpoint)
    try:
        try:
            back = target.run(moved, deadline=target.deadline * _SLOWER)
        except (PoolError, PoolStartError) as error:
            raise MoveViolation(source, case, moved_to, [str(error)]) from None
        arrived, problems = reports(back)
        problems += [
            f"{moved_to} rank {outcome.rank} raised {outcome.error.describe()}\n"
            f"{outcome.error.traceback}"
            for outcome in back
            if outcome.error is not None
        ]
        if not problems and arrived[0].refused is None:
            problems = check_move(
                source.target.name,
                moved_to,
                first.losses,
                arrived[0].losses,
                case.run,
            )
        if problems:
            raise MoveViolation(source, case, moved_to, problems)
    finally:
        shutil.rmtree(Path(first.checkpoint).parent, ignore_errors=True)


def prove_moves(
    source: RankPool,
    target_pool: Callable[[str], RankPool],
    *,
    max_examples: int,
    shrink: bool = True,
    seed: int | None = None,
) -> int:
    """Prove that ``source``'s checkpoints move to each strategy it declares compatible.

    ``target_pool(name)`` gives the running pool of a compatible strategy at
    ``source``'s world size and lane. Each drawn run is saved mid-way on ``source``,
    goes on there, and goes on from the same checkpoint on the target: the losses
    must agree within the precision's rounding.

    Returns:
        How many examples ran, over every compatible strategy.

    Raises:
        MoveViolation: A move did not go on with the source's losses.
    """
    __tracebackhide__ = True
    source.start()
    return sum(
        _prove_move(
            source, target_pool(name), name, max_examples=max_examples, shrink=shrink, seed=seed
        )
        for name in source.semantics.compatible
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

    def run(case: Case) -> None:
        nonlocal count
        assert isinstance(case, TrainingCase)
        count += 1
        try:
            _moved(source, target, case, moved_to=name)
        except MoveViolation as violation:
            violation.locate(seed=seed, explicit=False)
            violation.examples = count
            raise

    test = drawing(
        run,
        generate.moves(source.world_size, source.semantics),
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
    source: str, target: str, case: TrainingCase, *, world_size: int, backend: str = "gloo"
) -> None:
    """Rerun one move, as a failure report prints it (under ``if __name__ == "__main__":``).

    Raises:
        MoveViolation: The move still does not go on with the source's losses.
    """
    with (
        RankPool(source, world_size=world_size, backend=backend) as there,
        RankPool(target, world_size=world_size, backend=backend) as here,
    ):
        _moved(there, here, case, moved_to=target)
