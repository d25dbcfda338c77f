"""The checkpoint round trip: save, disturb, load, and compare every state, on every rank.

Each rank finds what its own state lost and reports it; the module alone loaded
afterwards keeps the load contract (the module restored, the optimizer as it was).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import torch
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.kind import Property
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.training.cases import StateValue, StoppedCase, TrainingRun
from plait.conformance.training.compare import copied, differences
from plait.conformance.training.example import SLOWER, TrainingKind
from plait.conformance.training.generate import (
    checkpoint_ios,
    declared_period,
    grid_run,
    inside_second_period,
    next_meeting,
    stopped_run,
    user_states,
)
from plait.conformance.training.loop import (
    Loop,
    TrainingReport,
    UserState,
    finish,
    scratch_directory,
    seed_streams,
    user_value,
)

if TYPE_CHECKING:
    from plait.conformance.target import StrategyTarget
    from plait.core import Strategy, TrainingSemantics

__all__ = ["CHECKPOINT_ROUND_TRIP", "RoundTrip", "RoundTripCase", "round_trip_grid", "round_trips"]


@attrs.frozen(hash=False)  # it holds a dict
class RoundTripCase(StoppedCase):
    """A run saved after ``stop_at`` steps, disturbed, loaded back and compared.

    Attributes:
        user_state: What the user's `Stateful` object saved with the run holds.
    """

    user_state: dict[int | str, StateValue] = attrs.field(factory=dict, kw_only=True)


@st.composite
def _round_trip(draw: st.DrawFn, semantics: TrainingSemantics) -> RoundTripCase:
    run, stop_at, _ = draw(stopped_run(semantics, inside=False, goes_on=False))
    return RoundTripCase(
        run, stop_at=stop_at, checkpoint_io=draw(checkpoint_ios()), user_state=draw(user_states())
    )


def round_trips(world_size: int, semantics: TrainingSemantics) -> st.SearchStrategy[RoundTripCase]:
    """A run saved after some steps, with every checkpoint IO, and a user's state."""
    del world_size
    return _round_trip(semantics)


def round_trip_grid(world_size: int, semantics: TrainingSemantics) -> list[RoundTripCase]:
    """The round trip every run tries first: Adam, a per-step scheduler, int keys."""
    del world_size
    run = TrainingRun(
        "mlp", 7, micro_batch=2, accumulate=1, steps=5, steps_per_epoch=2,
        optimizer="adam", scheduler="step",
    )  # fmt: skip
    user: dict[int | str, StateValue] = {0: {1: [(0.5, -1.0)], "a": 2}, "b": [3, (1.5,)]}
    period = declared_period(semantics)
    stop = 3 if period is None else inside_second_period(period)
    return [RoundTripCase(grid_run(semantics, run), stop_at=stop, user_state=user)]


CHECKPOINT_ROUND_TRIP: Final = Property(
    "checkpoint_round_trip",
    "save_checkpoint then load_checkpoint, with every checkpoint IO the strategy "
    "accepts, restores the module, optimizer, scheduler, the strategy's own state "
    "(whatever else its get_state_dict holds), every rank's random streams and a "
    "user's Stateful object (int keys, nested containers, tensors) exactly, on every "
    "rank; then load_checkpoint(path, module) restores each rank's own module alone, "
    "leaves the optimizer as it was and gives back the run's entries",
    draws=round_trips,
    declared_grid=round_trip_grid,
    over_groups=False,
    slower=SLOWER,
)


class RoundTrip(TrainingKind[RoundTripCase]):
    """Train, save, disturb everything, load it back, and compare every state."""

    case_type = RoundTripCase
    properties = (CHECKPOINT_ROUND_TRIP,)

    @override
    def train(
        self,
        strategy: Strategy,
        target: StrategyTarget,
        case: RoundTripCase,
        semantics: TrainingSemantics,
    ) -> TrainingReport:
        run = case.run
        seed_streams(run, strategy.global_rank)
        problems: list[str] = []
        try:
            loop = Loop(strategy, run, model_seed=run.seed)
            user = UserState(user_value(case.user_state))
            loop.begin()
            loop.train(0, case.stop_at)
            with scratch_directory(strategy) as directory:
                path = str(Path(directory) / "checkpoint")
                saved_user = copied(user.value)
                strategy.save_checkpoint(loop.state(user), path)
                strategy.barrier()  # where rank 0 writes alone, it has written
                saved = loop.snapshot()
                # Disturb everything (up to the next meeting, where the replicas
                # meet: the strategy's own state moves too), then load it back into
                # the same objects.
                loop.train(case.stop_at, next_meeting(semantics, case.stop_at))
                user.value = {"disturbed": True}
                torch.rand(3)
                random.random()
                loop.restore(path, user)
                loaded = loop.snapshot()
                for part in saved:
                    problems += [
                        f"after a save and a load, {part}{problem.removeprefix('the value')}"
                        for problem in differences(saved[part], loaded[part])
                    ]
                problems += [
                    f"after a save and a load, the user's Stateful object{problem}"
                    for problem in differences(saved_user, user.value)
                ]
                problems += _module_alone(loop, path, saved)
        finally:
            finish(strategy)
        return TrainingReport(semantics, problems=tuple(problems))


def _module_alone(loop: Loop, path: str, saved: dict[str, object]) -> list[str]:
    """The load contract: the module alone is restored, every optimizer left as it was."""
    loop.train(loop.progress.global_step, loop.progress.global_step + 1)
    before = loop.snapshot()
    rest = dict(loop.strategy.load_checkpoint(path, loop.module))
    after = loop.snapshot()
    problems = [
        f"load_checkpoint(path, module) did not restore the module: {problem}"
        for problem in differences(saved["module"], after["module"])
    ]
    if not problems:
        # What this rank's module holds itself: a strategy's state may be rank 0's on
        # every rank while each rank holds (and must get back) its own.
        problems += [
            f"load_checkpoint(path, module) did not restore this rank's own module: {problem}"
            for problem in differences(saved["module's tensors"], after["module's tensors"])
        ]
    problems += [
        f"load_checkpoint(path, module) changed the optimizer's state: {problem}"
        for problem in differences(before["optimizer"], after["optimizer"])
    ]
    read = sorted(
        str(key) for key in rest if key in ("model", "optimizer", "state_dict", "optimizer_states")
    )
    if read:
        problems.append(
            f"load_checkpoint(path, module) gave back {read}: the module and optimizer "
            "states are not the run's entries"
        )
    if "loop" not in rest:
        problems.append(
            f"load_checkpoint(path, module) gave back {sorted(map(str, rest))}, without the "
            "run's entry 'loop'"
        )
    return problems


EXAMPLE_KINDS.register(RoundTrip())
