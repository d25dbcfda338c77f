"""The training kit's runs reach the declared period, and its failures name their cause.

Each check is in one process: the runs drawn for a declaration, and the reports of
ranks whose run is a likely flaw's (computed as the reference computes), judged as
the kit judges the ranks'.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.conformance.training.cases import TrainingRun
from plait.conformance.training.flaws import likely_flaws
from plait.conformance.training.generate import coverage, declared_period, next_meeting
from plait.conformance.training.loop import TrainingReport
from plait.conformance.training.reference import (
    Meetings,
    Reference,
    meetings_reference,
    reference,
    resized_reference,
)
from plait.conformance.training.replicas import ReplicasCase, check_replicas, replicas
from plait.conformance.training.resume import ResumeCase, resume_grid, resumes
from plait.conformance.training.round_trip import RoundTripCase, round_trip_grid, round_trips
from plait.core import PeriodicAveraging, Synchronous, TrainingSemantics

DILOCO = PeriodicAveraging(every=4, outer_lr=0.7, outer_momentum=0.9, nesterov=True)
RUN = TrainingRun("mlp", 7, micro_batch=2, accumulate=2, steps=9, steps_per_epoch=2)


@settings(max_examples=40, deadline=None)
@given(period=st.integers(1, 16), data=st.data())
def test_runs_and_stops_reach_two_meetings_whatever_the_declared_period(
    period: int, data: st.DataObject
) -> None:
    semantics = TrainingSemantics(replicas=PeriodicAveraging(every=period))
    drawn = data.draw(replicas(2, semantics))
    assert 2 * period <= drawn.run.steps <= max(2 * period, 3 * period - 1)
    if drawn.run.steps >= 8:  # long runs take small windows
        assert drawn.run.accumulate <= 2
        assert drawn.run.micro_batch <= 2
    stopped = data.draw(resumes(2, semantics))
    assert 1 <= stopped.stop_at < stopped.run.steps
    for case in [*resume_grid(2, semantics), *round_trip_grid(2, semantics)]:
        assert case.run.steps == 2 * period + 1
        assert case.stop_at >= period  # past the first meeting: the outer state is there
    stops = {case.stop_at for case in resume_grid(2, semantics)}
    assert 2 * period in stops  # right after the second meeting
    if period > 1:
        assert period + 1 in stops  # inside the second period
    assert next_meeting(semantics, period) == 2 * period
    assert next_meeting(semantics, 2 * period - 1) == 2 * period


def test_the_stops_drawn_fall_after_meetings_and_inside_periods() -> None:
    semantics = TrainingSemantics(replicas=PeriodicAveraging(every=4))
    seen: set[str] = set()

    @settings(max_examples=60, deadline=None, database=None)
    @given(case=round_trips(2, semantics))
    def draw(case: RoundTripCase) -> None:
        if case.stop_at % 4 == 0:
            seen.add("after")
        elif case.stop_at > 4:
            seen.add("inside")

    draw()
    assert seen == {"after", "inside"}


def test_a_synchronous_declaration_keeps_short_runs_and_its_grid() -> None:
    semantics = TrainingSemantics()
    assert declared_period(semantics) is None
    assert next_meeting(semantics, 3) == 4
    [case] = resume_grid(2, semantics)
    assert (case.run.steps, case.stop_at, case.stop_inside) == (5, 3, 1)


def test_the_summary_says_the_period_the_lengths_and_the_stops() -> None:
    semantics = TrainingSemantics(replicas=PeriodicAveraging(every=4))
    cases = [
        ResumeCase(RUN, stop_at=5),
        ResumeCase(RUN, stop_at=8),
        ResumeCase(TrainingRun("mlp", 1, 1, 1, 11, 1), stop_at=2),
    ]
    assert coverage(cases, semantics) == (
        "period 4 declared; 3 runs of 9 to 11 steps (2 meetings before the end); stops "
        "after steps 2, 5, 8 (1 right after a meeting, 1 inside a period after one)"
    )
    assert coverage([ReplicasCase(RUN)], TrainingSemantics()) == (
        "no period declared (synchronous); 1 runs of 9 steps"
    )


def test_the_declared_meetings_are_the_declared_reference() -> None:
    declared = reference(RUN, 2, DILOCO)
    again = meetings_reference(RUN, 2, Meetings.of(DILOCO))
    assert declared.losses == again.losses
    assert all(
        all(a.equal(b) for a, b in zip(one, other, strict=True))
        for one, other in zip(declared.replicas, again.replicas, strict=True)
    )


def _reports(run: Reference, semantics: TrainingSemantics) -> list[TrainingReport]:
    return [
        TrainingReport(
            semantics=semantics,
            losses=run.losses,
            replicas=tuple(tuple(after[rank].tolist()) for after in run.replicas),
            export=run.final,
        )
        for rank in range(2)
    ]


@pytest.mark.parametrize(
    ("flaw", "named"),
    [
        (Meetings(None, at_end=False), "the run matches replicas that never meet"),
        (
            Meetings(8, outer_lr=0.7, outer_momentum=0.9, nesterov=True),
            "the run matches replicas meeting every 8 steps, not 4",
        ),
        (
            Meetings(4, outer_lr=0.7, outer_momentum=0.9, nesterov=True, sign=-1.0),
            "the run matches an outer step of the wrong sign",
        ),
        (
            Meetings(4, outer_lr=0.7),
            "the run matches meetings without the outer momentum",
        ),
        (
            Meetings(4, outer_lr=0.7, outer_momentum=0.9),
            "the run matches the outer momentum without Nesterov's correction",
        ),
        (
            Meetings(4, outer_lr=0.7, outer_momentum=0.9, nesterov=True, at_end=False),
            "the run matches no meeting at the end of training",
        ),
    ],
)
def test_a_run_that_is_a_likely_flaws_is_named_as_that_flaw(flaw: Meetings, named: str) -> None:
    semantics = TrainingSemantics(replicas=DILOCO)
    reports = _reports(meetings_reference(RUN, 2, flaw), semantics)
    problems = check_replicas(ReplicasCase(RUN), reports)
    assert problems
    assert problems[0].startswith(named), problems[0]


def test_synchronous_replicas_that_part_are_shown_where_they_part() -> None:
    semantics = TrainingSemantics()
    alone = meetings_reference(RUN, 2, Meetings(None, at_end=False))
    problems = check_replicas(ReplicasCase(RUN), _reports(alone, semantics))
    assert problems[0].startswith("the run matches replicas that never meet"), problems[0]
    assert "the replicas part after step 0: rank 0 holds " in problems[0]
    # The declared run itself has no cause to name.
    right = _reports(reference(RUN, 2, Synchronous()), semantics)
    assert check_replicas(ReplicasCase(RUN), right) == []


def test_every_period_has_its_flaws_and_none_is_the_declaration() -> None:
    for every in (1, 2, 4, 16):
        declared = PeriodicAveraging(every=every, outer_lr=0.5, outer_momentum=0.9)
        flaws = likely_flaws(declared, 2 * every + 1)
        assert Meetings.of(declared) not in [flaw for _, flaw in flaws]
        assert len({words for words, _ in flaws}) == len(flaws)


def _adamw(parameters: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=0.3, weight_decay=0.1)


def _halving(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def test_a_declared_outer_optimizer_is_the_reference_and_losing_its_state_is_named() -> None:
    declared = PeriodicAveraging(every=4, outer_optimizer=_adamw, outer_scheduler=_halving)
    semantics = TrainingSemantics(replicas=declared)
    right = _reports(reference(RUN, 2, declared), semantics)
    assert check_replicas(ReplicasCase(RUN), right) == []
    # Not the outer SGD: the factory's AdamW moves the anchor otherwise.
    plain = meetings_reference(RUN, 2, Meetings(4))
    assert plain.losses[5] != reference(RUN, 2, declared).losses[5]
    fresh = Meetings(4, outer_optimizer=_adamw, outer_scheduler=_halving, fresh_outer=True)
    problems = check_replicas(
        ReplicasCase(RUN), _reports(meetings_reference(RUN, 2, fresh), semantics)
    )
    assert problems[0].startswith("the run matches an outer optimizer made anew"), problems[0]
    assert "outer optimizer _adamw scheduled by _halving" in problems[1], problems[1]


def test_a_resized_run_is_the_run_until_the_move_and_the_new_ranks_global_batch_after() -> None:
    at_two = reference(RUN, 2, Synchronous())
    assert resized_reference(RUN, 2, 2, 4).losses == at_two.losses
    resized = resized_reference(RUN, 2, 3, 4)
    assert resized.losses[:4] == at_two.losses[:4]  # two ranks' global batches, saved
    assert resized.losses[4] != at_two.losses[4]  # three ranks' from the move on
