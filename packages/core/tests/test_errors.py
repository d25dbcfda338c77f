import pickle
import signal

import pytest

from plait.core import (
    CheckpointError,
    CollectiveCall,
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ConfigurationError,
    MissingDependencyError,
    PeerFailedError,
    PlaitError,
)
from plait.core.errors import suggest
from plait.core.stopping import TrainingStopped, stopped_by

REDUCE_SUM = CollectiveCall("reduce", {"op": "sum", "shape": (3,)})
REDUCE_MAX = CollectiveCall("reduce", {"op": "max", "shape": (3,)})
BARRIER = CollectiveCall("barrier")


def _examples() -> list[PlaitError]:
    return [
        ConfigurationError.invalid_choice("strategy", "dpp", ["ddp", "fsdp"], fix="use ddp"),
        MissingDependencyError(
            feature="the 'deepspeed' strategy",
            install="plait-strategies[deepspeed]",
            module="deepspeed",
        ),
        CheckpointError("/ckpt/last.pt", "the file is truncated", fix="save it again"),
        CollectiveMismatchError({0: REDUCE_SUM, 1: REDUCE_SUM, 2: REDUCE_MAX}),
        CollectiveTimeoutError(
            "barrier", name="epoch-end", timeout=2.5, missing_ranks=[3, 1], arrived_ranks=[0, 2]
        ),
        PeerFailedError(1, -9, "Traceback (most recent call last):\nRuntimeError: boom"),
    ]


@pytest.mark.parametrize("error", _examples(), ids=lambda e: type(e).__name__)
def test_every_error_is_a_plait_error_and_survives_pickling(error: PlaitError) -> None:
    restored = pickle.loads(pickle.dumps(error))

    assert isinstance(restored, PlaitError)
    assert type(restored) is type(error)
    assert str(restored) == str(error)
    assert vars(restored) == vars(error)


def test_configuration_error_names_value_choices_suggestion_and_fix() -> None:
    error = ConfigurationError.invalid_choice("strategy", "dpp", ["ddp", "fsdp"], fix="use ddp")

    assert isinstance(error, ValueError)
    assert error.value == "dpp"
    assert error.choices == ("ddp", "fsdp")
    assert error.suggestion == "ddp"
    assert error.fix == "use ddp"
    message = str(error)
    assert "'dpp'" in message
    assert "'ddp', 'fsdp'" in message
    assert "did you mean 'ddp'?" in message
    assert "fix: use ddp" in message


def test_configuration_error_without_choices_is_just_the_message() -> None:
    assert str(ConfigurationError("devices must be positive")) == "devices must be positive"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("dpp", "ddp"), ("DDP_SPAWM", "ddp_spawn"), ("zzz", None), (3, None), ("ddpp", "ddp")],
)
def test_suggest_finds_the_closest_choice_case_insensitively(
    value: object, expected: str | None
) -> None:
    assert suggest(value, ["ddp", "ddp_spawn", "fsdp"]) == expected


def test_suggest_prefers_the_mistyped_name_of_the_same_length() -> None:
    # "dpp" is one letter from both; a typo keeps the length more often than not.
    assert suggest("dpp", ["dp", "ddp", "fsdp"]) == "ddp"
    assert suggest("fdsp", ["dp", "ddp", "fsdp"]) == "fsdp"  # two letters swapped


def test_missing_dependency_error_is_an_import_error_naming_what_to_install() -> None:
    error = MissingDependencyError(
        feature="the 'deepspeed' strategy",
        install="plait-strategies[deepspeed]",
        module="deepspeed",
    )

    assert isinstance(error, ImportError)
    assert "'deepspeed'" in str(error)
    assert "pip install 'plait-strategies[deepspeed]'" in str(error)


def test_mismatch_error_names_the_disagreeing_ranks_and_each_call() -> None:
    error = CollectiveMismatchError({2: REDUCE_MAX, 0: REDUCE_SUM, 1: REDUCE_SUM})

    assert isinstance(error, CollectiveError)
    assert error.expected == REDUCE_SUM
    assert error.disagreeing_ranks == (2,)
    assert list(error.calls) == [0, 1, 2]
    message = str(error)
    assert "ranks 2 called a different collective" in message
    assert "ranks 0, 1 called reduce(op=sum, shape=(3,))" in message
    assert "ranks 2 called reduce(op=max, shape=(3,))" in message


def test_mismatch_error_breaks_ties_towards_the_lowest_rank() -> None:
    error = CollectiveMismatchError({0: BARRIER, 1: REDUCE_SUM})

    assert error.expected == BARRIER
    assert error.disagreeing_ranks == (1,)


def test_mismatch_error_needs_at_least_one_call() -> None:
    with pytest.raises(ValueError, match="at least one rank"):
        CollectiveMismatchError({})


def test_timeout_error_names_missing_and_arrived_ranks() -> None:
    error = CollectiveTimeoutError(
        "barrier", name="epoch-end", timeout=2.5, missing_ranks=[3, 1], arrived_ranks=[2, 0]
    )

    assert error.missing_ranks == (1, 3)
    assert error.arrived_ranks == (0, 2)
    assert str(error) == (
        "barrier 'epoch-end' timed out after 2.5 s: ranks 1, 3 did not arrive (arrived: 0, 2)"
    )


def test_peer_failed_error_names_the_signal_and_keeps_the_traceback_tail() -> None:
    traceback = "\n".join(f"line {i}" for i in range(100))
    error = PeerFailedError(3, -signal.SIGKILL, traceback)

    assert error.rank == 3
    assert error.exit_code == -9
    assert error.traceback_tail.splitlines() == [f"line {i}" for i in range(80, 100)]
    assert str(error).startswith("rank 3 failed (exit code -9, killed by SIGKILL):\nline 80")


def test_peer_failed_error_headline_names_the_cause_and_ends_with_the_error_text() -> None:
    tail = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: boom'
    error = PeerFailedError(1, 1, tail)

    assert error.cause == "RuntimeError: boom"
    assert str(error).splitlines()[0] == "rank 1 failed (exit code 1): RuntimeError: boom"
    assert str(error).splitlines()[-1] == "RuntimeError: boom"


def test_a_stalled_rank_is_named_with_the_ranks_that_waited_for_it() -> None:
    error = PeerFailedError(0, -9, waited_by=[1, 2], stalled_for=3.0)

    assert str(error) == (
        "rank 0 stalled: rank 1, 2 timed out after 3 s waiting for it in a collective, "
        "and it did not stop by itself; it was stopped (exit code -9, killed by SIGKILL)"
    )
    assert pickle.loads(pickle.dumps(error)).waited_by == (1, 2)


@pytest.mark.parametrize(
    ("exit_code", "described"),
    [(None, "exit code unknown"), (1, "exit code 1"), (-15, "exit code -15, killed by SIGTERM")],
)
def test_exit_codes_are_described_as_people_read_them(
    exit_code: int | None, described: str
) -> None:
    assert PeerFailedError.describe_exit(exit_code) == described


def test_checkpoint_error_names_the_path_reason_and_fix() -> None:
    error = CheckpointError("memory://ckpt.pt", "not a checkpoint", fix="pick another file")

    assert (error.path, error.reason, error.fix) == (
        "memory://ckpt.pt",
        "not a checkpoint",
        "pick another file",
    )
    assert str(error) == "checkpoint 'memory://ckpt.pt': not a checkpoint\n  fix: pick another file"


def test_a_graceful_stop_exits_with_128_plus_the_signal_and_pickles() -> None:
    stopped = TrainingStopped(signal.SIGTERM, "runs/last.ckpt", 37)

    assert isinstance(stopped, SystemExit)
    assert stopped.code == 143
    assert str(stopped) == (
        "training stopped on SIGTERM at step 37: saved to runs/last.ckpt; "
        "resume with ckpt_path='last'"
    )
    copy = pickle.loads(pickle.dumps(stopped))
    assert (copy.signal, copy.checkpoint, copy.global_step) == (
        signal.SIGTERM,
        "runs/last.ckpt",
        37,
    )
    assert stopped_by(143) is signal.SIGTERM
    assert stopped_by(128 + signal.SIGUSR1) is signal.SIGUSR1
    assert stopped_by(-15) is None  # killed by SIGTERM: no chance to save
    assert stopped_by(1) is None
    assert stopped_by(None) is None
