"""Hypothesis strategies of training examples, for a world size and a declared semantics.

Every draw shrinks toward the simplest example: an MLP, SGD, no scheduler, one
micro-batch per step, 32-bit, the strategy's own checkpoint IO.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypothesis import strategies as st

from plait.conformance.training.cases import (
    MODELS,
    OPTIMIZERS,
    SCHEDULERS,
    StateValue,
    TrainingCase,
    TrainingRun,
)
from plait.core import CheckpointIORegistry

if TYPE_CHECKING:
    from plait.core import TrainingSemantics

__all__ = [
    "checkpoint_ios",
    "moves",
    "replicas",
    "replicas_grid",
    "resume_grid",
    "resumes",
    "round_trip_grid",
    "round_trips",
    "runs",
    "user_states",
]

_UNUSABLE_IO = frozenset({"xla"})  # needs torch_xla's devices: the XLA lane's own


def runs(semantics: TrainingSemantics, *, min_steps: int = 2) -> st.SearchStrategy[TrainingRun]:
    """Small runs: every model, optimizer, scheduler and declared precision."""
    return st.builds(
        TrainingRun,
        model=st.sampled_from(MODELS),
        seed=st.integers(0, 2**16),
        micro_batch=st.integers(1, 3),
        accumulate=st.integers(1, 3),
        steps=st.integers(min_steps, 6),
        steps_per_epoch=st.integers(1, 3),
        optimizer=st.sampled_from(OPTIMIZERS),
        scheduler=st.sampled_from(SCHEDULERS),
        precision=st.sampled_from(semantics.precisions),
    )


def checkpoint_ios() -> st.SearchStrategy[str | None]:
    """The strategy's own checkpoint IO first, then each registered one."""
    names = sorted(set(CheckpointIORegistry.available()) - _UNUSABLE_IO)
    return st.sampled_from([None, *names])


def user_states() -> st.SearchStrategy[dict[int | str, StateValue]]:
    """What a user's `Stateful` object holds: nested containers, int and str keys, tensors."""
    keys = st.integers(0, 9) | st.text("abc", min_size=1, max_size=3)
    leaves: st.SearchStrategy[StateValue] = (
        st.integers(-5, 5)
        | st.floats(-4, 4, allow_nan=False, width=32)
        | st.text("xyz", max_size=3)
        | st.booleans()
        | st.tuples(st.floats(-4, 4, allow_nan=False, width=32))
    )
    nested = st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
        max_leaves=8,
    )
    return st.dictionaries(keys, nested, min_size=1, max_size=3)


def replicas(world_size: int, semantics: TrainingSemantics) -> st.SearchStrategy[TrainingCase]:
    """Examples of the declared semantics: a run, its losses, replicas and export."""
    del world_size  # every run fits every world size
    return st.builds(TrainingCase, kind=st.just("replicas"), run=runs(semantics))


@st.composite
def _stopped(
    draw: st.DrawFn, semantics: TrainingSemantics, kind: str, *, inside: bool, io: bool
) -> TrainingCase:
    run = draw(runs(semantics))
    stop_at = draw(st.integers(1, run.steps - 1 if kind != "round_trip" else run.steps))
    stop_inside = draw(st.integers(0, run.accumulate - 1)) if inside else 0
    return TrainingCase(
        kind,  # type: ignore[arg-type]
        run,
        stop_at=stop_at,
        stop_inside=stop_inside,
        checkpoint_io=draw(checkpoint_ios()) if io else None,
        user_state=draw(user_states()) if kind == "round_trip" else {},
    )


def round_trips(world_size: int, semantics: TrainingSemantics) -> st.SearchStrategy[TrainingCase]:
    """A run saved after some steps, with every checkpoint IO, and a user's state."""
    del world_size
    return _stopped(semantics, "round_trip", inside=False, io=True)


def resumes(world_size: int, semantics: TrainingSemantics) -> st.SearchStrategy[TrainingCase]:
    """A run stopped inside an epoch (and inside an accumulation window), then resumed."""
    del world_size
    return _stopped(semantics, "resume", inside=True, io=True)


def moves(world_size: int, semantics: TrainingSemantics) -> st.SearchStrategy[TrainingCase]:
    """A run saved after some steps that goes on, here and where its checkpoint moves."""
    del world_size
    return _stopped(semantics, "move_out", inside=False, io=False)


# The grid: one example of each property that every run tries first, whatever the
# seed. Each is small and exercises what a flaw would show in: two epochs and an
# accumulation window (replicas that do not meet, or meet too seldom or in the
# wrong group, part from the reference at the first step), a stop inside an epoch
# and inside a window with schedulers of both intervals (state that is dropped,
# turned into strings or stepped again on load), and a stop between two meetings of
# a periodic strategy (replicas that differ).

_GRID_RUN = TrainingRun(
    model="mlp",
    seed=7,
    micro_batch=2,
    accumulate=2,
    steps=5,
    steps_per_epoch=2,
    optimizer="sgd",
    scheduler="epoch",
)


def replicas_grid(world_size: int) -> list[TrainingCase]:
    """The replicas example every run tries first."""
    del world_size
    return [TrainingCase("replicas", _GRID_RUN)]


def round_trip_grid(world_size: int) -> list[TrainingCase]:
    """The round trip every run tries first: Adam, a per-step scheduler, int keys."""
    del world_size
    run = TrainingRun(
        "mlp", 7, micro_batch=2, accumulate=1, steps=5, steps_per_epoch=2,
        optimizer="adam", scheduler="step",
    )  # fmt: skip
    user: dict[int | str, StateValue] = {0: {1: [(0.5, -1.0)], "a": 2}, "b": [3, (1.5,)]}
    return [TrainingCase("round_trip", run, stop_at=3, user_state=user)]


def resume_grid(world_size: int) -> list[TrainingCase]:
    """The resume every run tries first: inside an epoch and an accumulation window."""
    del world_size
    return [TrainingCase("resume", _GRID_RUN, stop_at=3, stop_inside=1)]
