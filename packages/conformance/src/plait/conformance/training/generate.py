"""Hypothesis strategies of training examples, for a world size and a declared semantics.

Every draw shrinks toward the simplest example: an MLP, SGD, no scheduler, one
micro-batch per step, 32-bit, the strategy's own checkpoint IO.

The runs are as long as the declaration needs, not a fixed few steps: where the
replicas meet every ``k`` steps (`plait.core.PeriodicAveraging`), a run reaches at
least two meetings (``2k`` to ``3k - 1`` steps, so that some end between two, where
training's end meets them), and a stop falls right after a meeting or inside a period
after one (where the outer optimizer, the anchor and the replicas all hold state of
their own), whatever ``k`` is; a long run takes small windows, to stay within the
kit's time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
from hypothesis import strategies as st

from plait.conformance.training.cases import (
    MODELS,
    MODELS_WITH_BUFFERS,
    OPTIMIZERS,
    SCHEDULERS,
    StateValue,
    StoppedCase,
    TrainingCase,
    TrainingRun,
)
from plait.core import CheckpointIORegistry, PeriodicAveraging

if TYPE_CHECKING:
    from plait.core import TrainingSemantics

__all__ = [
    "ATTENTION_RUN",
    "GRID_RUN",
    "NORM_RUN",
    "checkpoint_ios",
    "coverage",
    "declared_period",
    "grid_run",
    "inside_second_period",
    "meets_after",
    "next_meeting",
    "runs",
    "stopped_run",
    "stops",
    "user_states",
]

_UNUSABLE_IO = frozenset({"xla"})  # needs torch_xla's devices: the XLA lane's own


def declared_period(semantics: TrainingSemantics) -> int | None:
    """The steps between the replicas' meetings, where the declaration has meetings."""
    replicas = semantics.replicas
    return replicas.every if isinstance(replicas, PeriodicAveraging) else None


def meets_after(semantics: TrainingSemantics, steps: int) -> bool:
    """Whether the replicas (some fragment of them) meet once ``steps`` steps are taken."""
    replicas = semantics.replicas
    if not isinstance(replicas, PeriodicAveraging):
        return False
    return any(replicas.meets(fragment, steps) for fragment in range(replicas.parts))


def next_meeting(semantics: TrainingSemantics, step: int) -> int:
    """The steps a run has taken at its first meeting after ``step`` steps.

    Without meetings, ``step + 1``: the next step.
    """
    period = declared_period(semantics)
    if period is None:
        return step + 1
    return (step // period + 1) * period


def coverage(cases: Sequence[TrainingCase], semantics: TrainingSemantics) -> str:
    """The lengths of the runs ``cases`` trained and where they stopped, against the period.

    What a suite's summary says of a training property: that the runs reached the
    meetings the strategy declares, and where the stops fell.
    """
    period = declared_period(semantics)
    lengths = sorted({case.run.steps for case in cases})
    said = f"period {period} declared" if period is not None else "no period declared (synchronous)"
    text = f"{said}; {len(cases)} runs of {_spans(lengths)} steps"
    if period is not None:
        meetings = sorted({length // period for length in lengths})
        text += f" ({_spans(meetings)} meetings before the end)"
    stopping = [case for case in cases if isinstance(case, StoppedCase)]
    if not stopping:
        return text
    stops = sorted({case.stop_at for case in stopping})
    text += f"; stops after steps {', '.join(map(str, stops))}"
    if period is not None:
        after = sum(1 for case in stopping if case.stop_at % period == 0)
        inside = sum(1 for case in stopping if case.stop_at > period and case.stop_at % period)
        text += f" ({after} right after a meeting, {inside} inside a period after one)"
    return text


def _spans(values: Sequence[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]} to {values[-1]}"


_LONG: Final = 8
"""From this many steps on, a run's windows are small (one or two micro-batches of one
or two samples): the kit's time goes to steps, not to the samples in them."""


@st.composite
def runs(draw: st.DrawFn, semantics: TrainingSemantics, *, min_steps: int = 2) -> TrainingRun:
    """Small runs: every model, optimizer, scheduler and declared precision.

    Without meetings, 2 to 6 steps; with a period ``k``, ``2k`` to ``3k - 1`` (at
    least ``min_steps``), over epochs of one to three steps or of one period.
    """
    period = declared_period(semantics)
    if period is None:
        steps = draw(st.integers(min_steps, 6))
        epochs = st.integers(1, 3)
    else:
        low = max(min_steps, 2 * period)
        steps = draw(st.integers(low, max(low, 3 * period - 1)))
        epochs = st.integers(1, 3) | st.just(period)
    small = steps >= _LONG
    model = draw(st.sampled_from(MODELS))
    return TrainingRun(
        model=model,
        seed=draw(st.integers(0, 2**16)),
        # Batch normalization takes two samples or more.
        micro_batch=draw(st.integers(2 if model == "norm" else 1, 2 if small else 3)),
        accumulate=draw(st.integers(1, 2 if small else 3)),
        steps=steps,
        steps_per_epoch=draw(epochs),
        optimizer=draw(st.sampled_from(OPTIMIZERS)),
        scheduler=draw(st.sampled_from(SCHEDULERS)),
        precision=draw(st.sampled_from(semantics.precisions)),
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


def stops(semantics: TrainingSemantics, run: TrainingRun, last: int) -> st.SearchStrategy[int]:
    """Where a run of ``run.steps`` stops (1 to ``last`` steps taken).

    With a period ``k``: right after a meeting, or inside a period after the first
    meeting (anything else besides, less often).
    """
    period = declared_period(semantics)
    anywhere = st.integers(1, last)
    if period is None:
        return anywhere
    after = list(range(period, last + 1, period))
    inside = [step for step in range(period + 1, last + 1) if step % period]
    chosen = [st.sampled_from(found) for found in (after, inside) if found]
    return st.one_of(*chosen, anywhere)


@st.composite
def stopped_run(
    draw: st.DrawFn, semantics: TrainingSemantics, *, inside: bool, goes_on: bool
) -> tuple[TrainingRun, int, int]:
    """A run, where it stops (``stop_at``) and how far into the next window (``stop_inside``).

    ``goes_on``: the run trains after the stop (a resume, a move), so it stops before
    its last step. ``inside``: the stop may fall inside an accumulation window.
    """
    run = draw(runs(semantics))
    stop_at = draw(stops(semantics, run, run.steps - 1 if goes_on else run.steps))
    # A model with buffers stops between windows: a checkpoint saved inside one
    # holds the buffers its forwards updated, and a resume runs that window again,
    # whatever the strategy (the loop's to avoid, not the strategy's).
    inside = inside and run.model not in MODELS_WITH_BUFFERS
    stop_inside = draw(st.integers(0, run.accumulate - 1)) if inside else 0
    return run, stop_at, stop_inside


# The grid: the examples of each property that every run tries first, whatever the
# seed. Each is small and exercises what a flaw would show in: two epochs and an
# accumulation window (replicas that do not meet, or meet too seldom or in the
# wrong group, part from the reference at the first step), a stop inside an epoch
# and inside a window with schedulers of both intervals (state that is dropped,
# turned into strings or stepped again on load). Where the replicas meet every k
# steps, the runs reach two meetings and end between two (2k + 1 steps), and the
# stops fall inside the second period (the anchor, the outer momentum and the
# replicas all their own) and right after the second meeting.

GRID_RUN: Final = TrainingRun(
    model="mlp",
    seed=7,
    micro_batch=2,
    accumulate=2,
    steps=5,
    steps_per_epoch=2,
    optimizer="sgd",
    scheduler="epoch",
)


def grid_run(semantics: TrainingSemantics, run: TrainingRun = GRID_RUN) -> TrainingRun:
    """``run``, stretched to two meetings and one step where the replicas meet."""
    period = declared_period(semantics)
    return run if period is None else attrs.evolve(run, steps=2 * period + 1)


def inside_second_period(period: int) -> int:
    """A stop inside the second period (right after the first meeting where a period is 1)."""
    return period + 1 if period > 1 else 1


NORM_RUN: Final = attrs.evolve(GRID_RUN, model="norm", steps=3, scheduler="none")
"""A model with buffers (batch normalization), two micro-batches a step."""

ATTENTION_RUN: Final = attrs.evolve(
    GRID_RUN, model="attention", steps=3, optimizer="adam", scheduler="none"
)
"""A sequence model whose tokens a context-parallel strategy splits between ranks."""
