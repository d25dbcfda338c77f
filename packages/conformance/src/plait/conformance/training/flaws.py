"""The likely flaws of a strategy's replicas, and which one a failed run matches.

Where the ranks' run is not what the strategy declares, the message says more than
the first step that differs: the run is compared with the runs the likely flaws
give (replicas that never meet, that meet at another period or not at the end, an
outer step of the wrong sign, without its momentum or with the other momentum,
parameters averaged where gradients should be and the other way round), each
computed in one process like the declared one, and the one it matches is named. A
run that matches none is said to, with the flaws tried; where the declaration says
the replicas are one module, the first step at which two ranks' replicas part is
said with their values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs
import torch

from plait.conformance.training.reference import (
    Meetings,
    Reference,
    meetings_reference,
    reference,
)
from plait.core import Synchronous

if TYPE_CHECKING:
    from plait.conformance.training.cases import TrainingRun
    from plait.conformance.training.loop import TrainingReport
    from plait.core import Replicas

__all__ = ["Flaw", "diagnose", "likely_flaws", "parted"]

Flaw = tuple[str, Synchronous | Meetings]
"""A likely flaw: what it is in words, and how its replicas go."""


def likely_flaws(replicas: Replicas, steps: int) -> list[Flaw]:
    """The flaws a strategy declaring ``replicas`` most likely has, for a run of ``steps``."""
    never = "replicas that never meet (each rank trains alone on its own data)"
    if isinstance(replicas, Synchronous):
        return [
            (never, Meetings(None, at_end=False)),
            (
                (
                    "parameters averaged after every step instead of gradients (local "
                    "SGD meeting every step)"
                ),
                Meetings(1),
            ),
            (
                "replicas that meet only at the end of training",
                Meetings(None),
            ),
        ]
    declared = Meetings.of(replicas)
    every = replicas.every
    flaws: list[Flaw] = [(never, Meetings(None, at_end=False))]
    if replicas.periods:
        # Each group its own period: the likely flaw is one period for them all.
        own = ", ".join(map(str, replicas.periods))
        flaws.extend(
            (
                (
                    f"every parameter group meeting every {other} steps (not each at its own "
                    f"period of {own})"
                ),
                attrs.evolve(declared, every=other, periods=()),
            )
            for other in sorted({every, min(replicas.periods)})
        )
    others = sorted({every * 2, every + 1, every - 1, every // 2} - {every, 0})
    flaws.extend(
        (f"replicas meeting every {other} steps, not {every}", attrs.evolve(declared, every=other))
        for other in others
        if other < steps and not replicas.periods
    )
    flaws.append(
        ("replicas that meet only at the end of training", attrs.evolve(declared, every=None))
    )
    if steps % every or replicas.parts > 1:  # some part of the module meets at the end
        flaws.append(
            (
                "no meeting at the end of training (on_train_end) over what is left of a period",
                attrs.evolve(declared, at_end=False),
            )
        )
    flaws.append(
        (
            (
                "an outer step of the wrong sign (anchor + lr * update: the mean change "
                "taken as a step up, not down)"
            ),
            attrs.evolve(declared, sign=-1.0),
        )
    )
    if replicas.fragments > 1:
        flaws.append(
            (
                (
                    f"every fragment meeting at once every {every} steps (not staggered "
                    f"over the period in {replicas.fragments} fragments)"
                ),
                attrs.evolve(declared, fragments=1),
            )
        )
    if replicas.outer_optimizer is not None:
        flaws.append(
            (
                "an outer optimizer made anew at each meeting (its state and schedule lost)",
                attrs.evolve(declared, fresh_outer=True),
            )
        )
        flaws.append(
            (
                "meetings that take the replicas' mean (no outer optimizer)",
                Meetings(every),
            )
        )
    if replicas.outer_momentum:
        flaws.append(
            (
                "meetings without the outer momentum (a plain outer SGD step)",
                attrs.evolve(declared, outer_momentum=0.0, nesterov=False),
            )
        )
        flaws.append(
            (
                "the outer momentum "
                + ("without Nesterov's correction" if replicas.nesterov else "as Nesterov's"),
                attrs.evolve(declared, nesterov=not replicas.nesterov),
            )
        )
    if replicas.outer_lr != 1:
        flaws.append(
            (
                f"meetings that take the replicas' mean (outer_lr=1, not {replicas.outer_lr})",
                attrs.evolve(declared, outer_lr=1.0, outer_momentum=0.0, nesterov=False),
            )
        )
    flaws.append(("gradients averaged at every step (synchronous replicas)", Synchronous()))
    return flaws


def diagnose(
    run: TrainingRun,
    kept: Sequence[TrainingReport],
    replicas: Replicas,
    judge: Callable[[Reference], list[str]],
) -> str:
    """Which likely flaw the ranks' run matches, in a sentence.

    ``judge`` gives the problems of the run against a reference: none where it matches.
    """
    world_size = kept[0].data_parallel(len(kept))
    tried = []
    for words, flaw in likely_flaws(replicas, run.steps):
        if isinstance(flaw, Synchronous):
            expected = reference(run, world_size, flaw)
        else:
            expected = meetings_reference(run, world_size, flaw)
        if not judge(expected):
            return (
                f"the run matches {words}, computed in one process: loss by loss and "
                "replica by replica"
            )
        tried.append(words)
    return "the run matches none of the likely flaws tried: " + "; ".join(tried)


def parted(kept: Sequence[TrainingReport], close: tuple[float, float]) -> str | None:
    """Where two ranks' replicas first part (beyond ``close``), with their values; None if never."""
    first = kept[0].replicas
    if first is None:
        return None
    for index, report in enumerate(kept[1:], start=1):
        mine = report.replicas
        if mine is None:
            continue
        for step, (theirs, ours) in enumerate(zip(first, mine, strict=False)):
            zero = torch.tensor(theirs, dtype=torch.float64)
            other = torch.tensor(ours, dtype=torch.float64)
            if zero.shape != other.shape or torch.allclose(
                zero, other, rtol=close[0], atol=close[1]
            ):
                continue
            gap = (zero - other).abs()
            at = int(gap.argmax())
            when = "after the end of training" if step == len(first) - 1 else f"after step {step}"
            return (
                f"the replicas part {when}: rank 0 holds {zero[at].item():.6g} and rank "
                f"{index} {other[at].item():.6g} at flat index {at}"
            )
    return None
