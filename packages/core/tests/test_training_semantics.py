"""What a strategy declares about training: each bad declaration is refused when made."""

from __future__ import annotations

import pytest
import torch

from plait.core import ConfigurationError, PeriodicAveraging, TrainingSemantics


def _adam(parameters: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=0.1)


def _halving(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def test_an_outer_optimizer_and_its_schedule_are_declared_by_their_factories() -> None:
    declared = PeriodicAveraging(
        every=4, outer_optimizer=_adam, outer_scheduler=_halving, validates="anchor"
    )
    assert declared.outer_optimizer is _adam
    assert declared == PeriodicAveraging(
        every=4, outer_optimizer=_adam, outer_scheduler=_halving, validates="anchor"
    )
    assert TrainingSemantics(replicas=declared).replicas is declared


@pytest.mark.parametrize(
    ("arguments", "said", "fix"),
    [
        ({"every": 0}, "every=0 must be a whole number of steps", "every=4"),
        ({"every": 4, "outer_momentum": -0.9}, "outer_momentum=-0.9 must be a number", "0.9"),
        ({"every": 4, "validates": "average"}, "'average'", "'mean'"),
        (
            {"every": 4, "outer_optimizer": _adam, "outer_lr": 0.7},
            "outer_optimizer= declares the outer step, and so do outer_lr=0.7",
            "leave outer_lr, outer_momentum and nesterov out",
        ),
        (
            {"every": 4, "outer_optimizer": _adam, "nesterov": True},
            "nesterov=True",
            "in the factory",
        ),
        (
            {"every": 4, "outer_scheduler": _halving},
            "no outer_optimizer= is given",
            "pass outer_optimizer=",
        ),
        (
            {"every": 4, "outer_optimizer": "adam"},
            "outer_optimizer='adam' must be a factory",
            "a function of your module",
        ),
    ],
)
def test_a_bad_declaration_is_refused_naming_it_and_the_fix(
    arguments: dict[str, object], said: str, fix: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        PeriodicAveraging(**arguments)  # type: ignore[arg-type]
    message = str(refused.value)
    assert said in message, message
    assert fix in message, message


def test_only_synchronous_replicas_are_declared_resizable() -> None:
    assert TrainingSemantics(resizable=True).resizable
    with pytest.raises(ConfigurationError) as refused:
        TrainingSemantics(replicas=PeriodicAveraging(every=4), resizable=True)
    message = str(refused.value)
    assert "resizable=True is declared with PeriodicAveraging(every=4" in message, message
    assert "declare resizable=False" in message, message


def test_fragments_split_the_parameters_in_order_and_meet_staggered() -> None:
    streaming = PeriodicAveraging(every=4, fragments=2)
    assert [streaming.fragment(index, 5) for index in range(5)] == [0, 0, 0, 1, 1]
    assert [steps for steps in range(1, 10) if streaming.meets(0, steps)] == [4, 8]
    assert [steps for steps in range(1, 10) if streaming.meets(1, steps)] == [2, 6]
    whole = PeriodicAveraging(every=4)
    assert [steps for steps in range(9) if whole.meets(0, steps)] == [4, 8]


def test_more_fragments_than_steps_in_a_period_are_refused() -> None:
    with pytest.raises(ConfigurationError) as refused:
        PeriodicAveraging(every=2, fragments=3)
    message = str(refused.value)
    assert "fragments=3 staggers the meetings over a period of every=2 steps" in message
    assert "pass fragments=2 or fewer" in message


def test_buffers_default_to_what_the_replicas_do_and_are_refused_naming_the_choices() -> None:
    assert TrainingSemantics().buffer_updates == "broadcast"
    assert TrainingSemantics(buffers="own").buffer_updates == "own"
    periodic = PeriodicAveraging(every=4)
    assert TrainingSemantics(replicas=periodic).buffer_updates == "own"
    with pytest.raises(ConfigurationError) as refused:
        TrainingSemantics(buffers="rank 0")  # type: ignore[arg-type]
    message = str(refused.value)
    assert "'rank 0'" in message, message
    assert "broadcast" in message, message
    assert "own" in message, message
    with pytest.raises(ConfigurationError) as refused:
        TrainingSemantics(replicas=periodic, buffers="broadcast")
    message = str(refused.value)
    assert "buffers='broadcast' is declared with PeriodicAveraging(every=4" in message, message
    assert "declare buffers='own'" in message, message


def test_a_period_per_parameter_group_meets_each_group_at_its_own_period() -> None:
    grouped = PeriodicAveraging(every=4, periods=[2, 4])
    assert grouped.periods == (2, 4)
    assert grouped.parts == 2
    assert [grouped.fragment(index, 5) for index in range(5)] == [0, 0, 0, 1, 1]
    assert [steps for steps in range(1, 9) if grouped.meets(0, steps)] == [2, 4, 6, 8]
    assert [steps for steps in range(1, 9) if grouped.meets(1, steps)] == [4, 8]


@pytest.mark.parametrize(
    ("arguments", "said", "fix"),
    [
        ({"every": 4, "periods": (2, 4), "fragments": 2}, "fragments=2 staggers", "one of them"),
        ({"every": 4, "periods": (2, 8)}, "every is the longest period", "pass every=8"),
        ({"every": 4, "periods": (0, 4)}, "periods=0 must be a whole number", "pass e.g."),
    ],
)
def test_a_bad_period_per_group_is_refused_naming_it_and_the_fix(
    arguments: dict[str, object], said: str, fix: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        PeriodicAveraging(**arguments)  # type: ignore[arg-type]
    message = str(refused.value)
    assert said in message, message
    assert fix in message, message
