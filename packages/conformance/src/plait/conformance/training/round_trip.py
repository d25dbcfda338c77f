"""The checkpoint round trip: save, disturb, load, and compare every state, on every rank.

Each rank finds what its own state lost and reports it; the module alone loaded
afterwards keeps the load contract (the module restored, the optimizer as it was).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Final

import torch
from typing_extensions import override

from plait.conformance.kind import Property
from plait.conformance.training import generate
from plait.conformance.training.compare import copied, differences
from plait.conformance.training.example import SLOWER, TRAINING_EXAMPLES, TrainingExample
from plait.conformance.training.generate import next_meeting
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
    from plait.conformance.training.cases import TrainingCase
    from plait.core import Strategy, TrainingSemantics

__all__ = ["CHECKPOINT_ROUND_TRIP", "RoundTrip"]

CHECKPOINT_ROUND_TRIP: Final = Property(
    "checkpoint_round_trip",
    "save_checkpoint then load_checkpoint, with every checkpoint IO the strategy "
    "accepts, restores the module, optimizer, scheduler, the strategy's own state "
    "(whatever else its get_state_dict holds), every rank's random streams and a "
    "user's Stateful object (int keys, nested containers, tensors) exactly, on every "
    "rank; then load_checkpoint(path, module) restores each rank's own module alone, "
    "leaves the optimizer as it was and gives back the run's entries",
    draws=generate.round_trips,
    declared_grid=generate.round_trip_grid,
    over_groups=False,
    slower=SLOWER,
)


class RoundTrip(TrainingExample):
    """Train, save, disturb everything, load it back, and compare every state."""

    kind = "round_trip"
    property = CHECKPOINT_ROUND_TRIP

    @override
    def run(
        self,
        strategy: Strategy,
        target: StrategyTarget,
        case: TrainingCase,
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


TRAINING_EXAMPLES.register(RoundTrip())
