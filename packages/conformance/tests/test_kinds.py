"""The registry of example kinds: one kind per case type, properties named once, clear refusals."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import pytest
from typing_extensions import override

import plait.conformance as case_values
from plait.conformance import (
    EXAMPLE_KINDS,
    PROPERTIES,
    TRAINING_PROPERTIES,
    CollectiveKind,
    ExampleKind,
    KindRegistry,
    MoveCase,
    Property,
    RankContext,
    ReduceCase,
    ResumeCase,
    StoppedCase,
    TensorSpec,
    TrainingCase,
    TrainingRun,
    property_of,
)
from plait.conformance.training.replicas import Replicas
from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.conformance.outcomes import Outcome


@attrs.frozen
class _EchoCase:
    value: int


class _EchoKind(CollectiveKind[_EchoCase]):
    case_type = _EchoCase
    properties = (Property("echo", "each rank gets its value back"),)

    @override
    def call(self, context: RankContext, case: _EchoCase, argument: object) -> object:
        return case.value

    @override
    def judge(
        self, case: _EchoCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        return [f"rank {o.rank}: {o.result!r}" for o in outcomes if o.result != case.value]


def test_every_case_type_of_the_contract_and_the_kit_has_a_kind_and_its_properties() -> None:
    collective = [
        value
        for value in vars(case_values).values()
        if isinstance(value, type)
        and value.__name__.endswith("Case")
        and value not in (TrainingCase, StoppedCase)  # what the kit's case types build on
    ]
    assert len(collective) == 14  # ten of the contract's and four of the training kit's
    assert all(case_type in EXAMPLE_KINDS for case_type in collective)
    registered = [prop.name for prop in EXAMPLE_KINDS.properties()]
    for prop in (*PROPERTIES, *TRAINING_PROPERTIES):
        assert prop.name in registered
        assert EXAMPLE_KINDS.property(prop.name) is prop


def test_a_kind_answers_for_the_property_of_its_examples() -> None:
    tensors = ReduceCase("sum", (TensorSpec("int64", (1,), (1,)),))
    assert property_of(tensors).name == "reduce_tensors"
    assert property_of(ReduceCase("sum", (1, 2))).name == "reduce_numbers"
    run = TrainingRun("mlp", 0, micro_batch=1, accumulate=1, steps=2, steps_per_epoch=1)
    assert property_of(ResumeCase(run, stop_at=1)).name == "resume_exactness"
    assert property_of(MoveCase(run, stop_at=1, source="saved")).name == "checkpoint_moves"


def test_a_case_type_and_a_property_name_are_registered_once() -> None:
    registry = KindRegistry()
    kind = _EchoKind()
    assert registry.register(kind) is kind
    assert registry.kind_of(_EchoCase(1)) is kind

    with pytest.raises(ConfigurationError, match="_EchoCase is already the case type of _EchoKind"):
        registry.register(_EchoKind())

    @attrs.frozen
    class OtherCase:
        value: int

    class SameName(_EchoKind):
        case_type = OtherCase  # type: ignore[assignment]

    with pytest.raises(ConfigurationError, match="the property 'echo' of SameName is already"):
        registry.register(SameName())
    assert OtherCase not in registry  # nothing of a refused kind is kept


def test_what_is_not_a_kind_of_attrs_cases_is_refused_naming_the_fix() -> None:
    registry = KindRegistry()
    with pytest.raises(ConfigurationError, match="not an ExampleKind") as caught:
        registry.register(object())  # type: ignore[arg-type]
    assert "subclass plait.conformance.ExampleKind" in str(caught.value)

    class Plain:
        pass

    class PlainKind(_EchoKind):
        case_type = Plain  # type: ignore[assignment]

    with pytest.raises(ConfigurationError, match="not an attrs class") as caught:
        registry.register(PlainKind())
    assert "@attrs.frozen" in str(caught.value)

    class Nameless(_EchoKind):
        properties = ()  # type: ignore[assignment]

    with pytest.raises(ConfigurationError, match="names no property"):
        registry.register(Nameless())


def test_an_example_of_no_registered_kind_and_an_unknown_property_are_named() -> None:
    registry = KindRegistry()
    registry.register(_EchoKind())
    with pytest.raises(
        ConfigurationError, match="no kind of example is registered for int"
    ) as caught:
        registry.kind_of(3)  # type: ignore[type-var]
    assert "_EchoCase" in str(caught.value)
    assert "EXAMPLE_KINDS.register" in str(caught.value)
    with pytest.raises(ConfigurationError, match="did you mean 'echo'"):
        registry.property("ecko")


def test_an_example_kind_needs_a_rank_part_and_a_judge() -> None:
    class Unfinished(ExampleKind[_EchoCase]):
        case_type = _EchoCase
        properties = (Property("unfinished", "nothing"),)

    with pytest.raises(TypeError, match="abstract"):
        Unfinished()  # type: ignore[abstract]


def test_a_training_kind_is_registered_once_and_a_case_of_none_is_named() -> None:
    registry = KindRegistry()
    registry.register(Replicas())
    with pytest.raises(ConfigurationError, match="ReplicasCase is already the case type of "):
        registry.register(Replicas())

    @attrs.frozen(hash=False)
    class UnregisteredCase(StoppedCase):
        pass

    run = TrainingRun("mlp", 0, micro_batch=1, accumulate=1, steps=2, steps_per_epoch=1)
    with pytest.raises(ConfigurationError, match="no kind of example is registered") as caught:
        EXAMPLE_KINDS.kind_of(UnregisteredCase(run, stop_at=1))
    assert "ResumeCase" in str(caught.value)  # the registered case types are listed
    with pytest.raises(ValueError, match=r"stop_at=3 must be within the run's 1\.\.2"):
        ResumeCase(run, stop_at=3)


def test_the_worker_names_what_replaced_its_table_of_examples_that_raise() -> None:
    from plait.conformance import worker  # noqa: PLC0415

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kinds = worker.THEN_REDUCE  # type: ignore[attr-defined]
    assert [warning.category for warning in caught] == [DeprecationWarning]
    assert "checks_after" in str(caught[0].message)
    assert isinstance(kinds, tuple)
    assert case_values.MismatchCase in kinds
