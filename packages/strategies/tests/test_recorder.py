"""The flight recorder keeps a process's most recent collectives, and how each ended."""

from __future__ import annotations

import pytest

from plait.core import CollectiveCall
from plait.strategies.collectives import FlightRecorder


def test_the_recorder_keeps_the_most_recent_calls_oldest_first() -> None:
    recorder = FlightRecorder(capacity=3)
    for number in range(1, 6):
        record = recorder.start(
            number, (0, 1), CollectiveCall("barrier", {"name": number}), "store"
        )
        record.end("done")

    assert [record.sequence for record in recorder.records()] == [3, 4, 5]
    assert all(
        record.state == "done" and record.seconds is not None for record in recorder.records()
    )


def test_a_call_still_waiting_says_so_and_how_long_so_far() -> None:
    recorder = FlightRecorder()
    recorder.start(1, (0, 1, 2), CollectiveCall("reduce", {"op": "sum"}), "backend").end("done")
    recorder.start(2, (0, 2), CollectiveCall("barrier", {"name": "epoch"}), "backend")

    lines = recorder.describe().splitlines()

    assert lines[0].startswith("#1 reduce(op=sum) over ranks [0, 1, 2] (backend): done after ")
    assert lines[1].startswith("#2 barrier(name=epoch) over ranks [0, 2] (backend): waiting for ")
    assert lines[1].endswith(" s so far")
    last = recorder.describe(last=1).splitlines()
    assert len(last) == 1
    assert last[0].startswith("#2 barrier(name=epoch)")


def test_an_empty_recorder_says_it_is_empty() -> None:
    assert FlightRecorder().describe() == "no collective recorded"


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True])
def test_a_capacity_that_is_not_a_positive_int_is_refused_by_value(capacity: object) -> None:
    with pytest.raises(ValueError, match=f"capacity={capacity!r} must be a positive int"):
        FlightRecorder(capacity=capacity)  # type: ignore[arg-type]
