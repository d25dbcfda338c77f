"""Which failure a launcher reports, from every rank's exit: the root cause, or the stall."""

import signal

from plait.strategies.launchers.children import Exit, diagnose, is_consequence, timeout_of

RAISED = 'Traceback (most recent call last):\n  File "x.py"\nRuntimeError: out of memory'
LOST = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"
GLOO_TIMEOUT = "RuntimeError: [unbound_buffer.cc:78] Timed out waiting 3000ms for recv"
NAMED_TIMEOUT = (
    "plait.core.errors.CollectiveTimeoutError: collective timed out after 3 s: "
    "ranks 0 did not arrive (arrived: 1)"
)


def test_the_first_rank_with_an_error_of_its_own_is_the_root_cause() -> None:
    # Rank 1 lost its connection before rank 0's own error was seen: rank 0 is named.
    failure = diagnose([Exit(1, 1, LOST), Exit(0, 1, RAISED)])

    assert failure.rank == 0
    assert failure.cause == "RuntimeError: out of memory"


def test_a_rank_killed_by_a_signal_is_a_root_cause() -> None:
    failure = diagnose([Exit(1, 1, LOST), Exit(0, -signal.SIGKILL, "")])

    assert (failure.rank, failure.exit_code) == (0, -9)


def test_only_reactions_leave_the_first_failure_named() -> None:
    assert diagnose([Exit(1, 1, LOST), Exit(2, 1, LOST)]).rank == 1


def test_a_timeout_while_a_rank_still_runs_names_that_rank_as_stalled() -> None:
    failure = diagnose([Exit(1, 1, NAMED_TIMEOUT), Exit(2, 1, GLOO_TIMEOUT)], [0], killed=[0])

    assert failure.rank == 0
    assert failure.stalled_for == 3.0
    assert failure.waited_by == (1, 2)
    assert str(failure).startswith(
        "rank 0 stalled: rank 1, 2 timed out after 3 s waiting for it in a collective"
    )
    assert failure.exit_code == -signal.SIGKILL


def test_a_stalled_rank_in_the_launching_process_has_no_exit_code() -> None:
    failure = diagnose([Exit(1, 1, NAMED_TIMEOUT)], [0])

    assert failure.exit_code is None
    assert str(failure).endswith("it was stopped")


def test_a_failure_that_is_no_timeout_is_not_a_stall_whoever_still_runs() -> None:
    assert diagnose([Exit(1, 1, RAISED)], [0]).stalled_for is None


def test_timeouts_are_read_from_gloo_and_from_plait() -> None:
    assert timeout_of(GLOO_TIMEOUT) == 3.0
    assert timeout_of(NAMED_TIMEOUT) == 3.0
    assert timeout_of(RAISED) is None
    assert is_consequence(LOST)
    assert not is_consequence(RAISED)
