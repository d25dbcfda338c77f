"""The properties of the contract, and how one example of each is run and judged."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import attrs
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import FlakyFailure

from plait.conformance import generate
from plait.conformance.cases import (
    AllGatherCase,
    BadArgumentCase,
    BarrierCase,
    BarrierTimeoutCase,
    BroadcastCase,
    Case,
    DecisionCase,
    GroupCase,
    MismatchCase,
    ReduceCase,
    TensorSpec,
)
from plait.conformance.pool import (
    UNHELD_DTYPES,
    PoolError,
    PoolStartError,
    RankHangError,
    RankPool,
)
from plait.conformance.spec import check
from plait.conformance.target import StrategyFactory, StrategyTarget

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "PROPERTIES",
    "ContractViolation",
    "Property",
    "property_of",
    "prove",
    "reproduce",
    "run_example",
]


@attrs.frozen
class Property:
    """One property of the contract, proved over many drawn examples.

    Attributes:
        name: The property's name; its test is ``test_<name>``.
        contract: What it proves, in a sentence.
        cases: The Hypothesis strategy of its examples, for a world size.
        min_world_size: The fewest ranks it means anything on.
        restarts_pool: Each example leaves the ranks out of step (a rank skipped a
            collective), so the pool starts afresh after it.
        max_examples: A cap on examples, for properties that restart the pool.
    """

    name: str
    contract: str
    cases: Callable[[int], SearchStrategy[Case]]
    min_world_size: int = 1
    restarts_pool: bool = False
    max_examples: int | None = None


def _tensor_reduces(world_size: int) -> SearchStrategy[Case]:
    return generate.reduce_cases(world_size)


def _number_reduces(world_size: int) -> SearchStrategy[Case]:
    return generate.reduce_cases(world_size, numbers=True)


PROPERTIES: Final = (
    Property(
        "reduce_tensors",
        "reduce(t, op) of every op and dtype, any shape (zero-size included) and layout, "
        "matches the reference on every rank, bit for bit the same everywhere, on the "
        "input's device; the mean of integers or bools is floating; the input is unchanged",
        _tensor_reduces,
    ),
    Property(
        "reduce_numbers",
        "reduce of Python ints and floats returns a Python number of the right type "
        "(int for sum/min/max/product of ints, float otherwise) equal to the reference",
        _number_reduces,
    ),
    Property(
        "broadcast",
        "broadcast(obj, src) gives every rank a value equal to src's: tensors of any "
        "dtype, shape and layout on the rank's root_device, and any picklable object",
        generate.broadcast_cases,
    ),
    Property(
        "all_gather",
        "all_gather(t) returns [world_size, *t.shape] whose row i is rank i's tensor, on "
        "every rank, for every dtype and layout",
        generate.all_gather_cases,
    ),
    Property(
        "sub_groups",
        "over a process group of some ranks, reduce, all_gather and broadcast keep the "
        "contract among its ranks (their inputs only, rows in their order, src a global "
        "rank), and a rank outside the group that calls with it raises ValueError",
        generate.group_cases,
        min_world_size=2,
    ),
    Property(
        "reduce_boolean_decision",
        "reduce_boolean_decision(b, all) is the logical all (or any) of every rank's b",
        generate.decision_cases,
    ),
    Property(
        "barrier",
        "no rank leaves barrier() before every rank has entered it (seen through a store "
        "each rank writes to on entering and reads on leaving)",
        generate.barrier_cases,
    ),
    Property(
        "barrier_timeout",
        "barrier(timeout=s) raises CollectiveTimeoutError naming the rank that never came",
        generate.barrier_timeout_cases,
        min_world_size=2,
        restarts_pool=True,
        max_examples=3,
    ),
    Property(
        "mismatch",
        "ranks that disagree on the collective, op, shape, dtype or src all raise "
        "CollectiveMismatchError naming what each rank called, never hang, and the "
        "strategy still works afterwards",
        generate.mismatch_cases,
        min_world_size=2,
    ),
    Property(
        "bad_arguments",
        "a value that is not a tensor or number raises TypeError naming its type; an "
        "unknown op ConfigurationError; src outside the ranks or a timeout <= 0 "
        "ValueError; on every rank, and the strategy still works afterwards",
        generate.bad_argument_cases,
    ),
)
"""Every property of the contract, in the order the suite runs them."""

_BY_NAME: Final = {prop.name: prop for prop in PROPERTIES}
_NAMES: Final[dict[type, str]] = {
    BroadcastCase: "broadcast",
    AllGatherCase: "all_gather",
    DecisionCase: "reduce_boolean_decision",
    BarrierCase: "barrier",
    BarrierTimeoutCase: "barrier_timeout",
    GroupCase: "sub_groups",
    MismatchCase: "mismatch",
    BadArgumentCase: "bad_arguments",
}


def property_of(case: Case) -> Property:
    """The property whose examples look like ``case``."""
    if isinstance(case, ReduceCase):
        tensors = isinstance(case.inputs[0], TensorSpec)
        return _BY_NAME["reduce_tensors" if tensors else "reduce_numbers"]
    return _BY_NAME[_NAMES[type(case)]]


_INTERMITTENT: Final = (
    "This example broke the contract once but not when it was run again: the flaw "
    "depends on timing or on what ran before it, so the snippet may need a few runs "
    "to show it."
)


class ContractViolation(AssertionError):  # noqa: N818 - a failed property, as pytest shows it
    """A strategy broke the contract on one example; the message says how to rerun it.

    Attributes:
        property: The property's name.
        case: The example.
        problems: What each rank did wrong.
        intermittent: The example broke the contract once but not when it was run
            again (a flaw that depends on timing or on what ran before).
    """

    def __init__(
        self,
        prop: Property,
        pool: RankPool,
        case: Case,
        problems: list[str],
        *,
        intermittent: bool = False,
    ) -> None:
        self.property = prop.name
        self.case = case
        self.problems = problems
        self.intermittent = intermittent
        names = sorted({type(case).__name__, "Call", "TensorSpec"})
        lines = [
            (
                f"{prop.name} failed for {pool.target.name!r} ({pool.backend}, world size "
                f"{pool.world_size}): {prop.contract}"
            ),
            *(f"  - {problem}" for problem in problems),
            *([_INTERMITTENT] if intermittent else []),
            "Run this example alone:",
            "    from plait.conformance import reproduce",
            f"    from plait.conformance.cases import {', '.join(names)}",
            "",
            '    if __name__ == "__main__":',
            (
                f"        reproduce({pool.target.spec!r}, {case!r}, "
                f"world_size={pool.world_size}, backend={pool.backend!r})"
            ),
        ]
        super().__init__("\n".join(lines))


class _Hung(BaseException):
    """Carries a hang out of Hypothesis, which would shrink it at a deadline per try."""

    def __init__(self, violation: ContractViolation) -> None:
        super().__init__(str(violation))
        self.violation = violation


def _sync_case(world_size: int) -> ReduceCase:
    return ReduceCase(
        "sum", tuple(TensorSpec("int64", (1,), (rank,)) for rank in range(world_size))
    )


def run_example(pool: RankPool, prop: Property, case: Case) -> None:
    """Run ``case`` on every rank of ``pool`` and judge it against the reference.

    Raises:
        ContractViolation: The outcomes differ from the reference, a rank died, or
            the strategy stopped working after ranks raised.
        _Hung: A rank hung (`prove` turns it into a `ContractViolation`).
    """
    try:
        outcomes = pool.run(case)
    except RankHangError as error:
        raise _Hung(ContractViolation(prop, pool, case, [str(error)])) from None
    except (PoolError, PoolStartError) as error:
        raise ContractViolation(prop, pool, case, [str(error)]) from None
    problems = check(case, outcomes, pool.devices)
    if prop.restarts_pool:
        pool.restart()
    elif not problems and any(outcome.error for outcome in outcomes):
        # Ranks raised as they should: the strategy must still work.
        sync = _sync_case(pool.world_size)
        try:
            after = check(sync, pool.run(sync), pool.devices)
        except RankHangError as error:
            problem = f"after the ranks raised, a plain reduce hung: {error}"
            raise _Hung(ContractViolation(prop, pool, case, [problem])) from None
        except PoolError as error:
            after = [str(error)]
        problems = [f"after the ranks raised, a plain reduce failed: {text}" for text in after]
    if problems:
        raise ContractViolation(prop, pool, case, problems)


def prove(pool: RankPool, prop: Property, *, max_examples: int, shrink: bool = True) -> int:
    """Run ``prop`` on up to ``max_examples`` drawn examples; return how many ran.

    Hypothesis draws the examples and, on a failure, shrinks it to a minimal one,
    which `ContractViolation` prints with a snippet that reruns it alone. A hang is
    reported as first found: each try at shrinking it would cost the pool's deadline.
    An example that fails once and passes when run again (a flaw that shows only
    under some timing) is still a violation: it is reported as found, marked
    intermittent, never passed over.

    Raises:
        ContractViolation: An example broke the contract.
    """
    count = 0
    limit = min(max_examples, prop.max_examples or max_examples)
    phases = [Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if shrink else [])]
    cases = prop.cases(pool.world_size)
    unheld = frozenset(UNHELD_DTYPES.get(pool.backend, {}))
    if unheld:  # the lane's devices cannot hold them: no example may use them
        cases = cases.filter(lambda case: not _dtypes_of(case) & unheld)

    @settings(
        max_examples=limit,
        deadline=None,
        database=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(case=cases)
    def examples(case: Case) -> None:
        nonlocal count
        count += 1
        run_example(pool, prop, case)

    try:
        examples()
    except _Hung as hung:
        raise hung.violation from None
    except FlakyFailure as flaky:
        found = _first_violation(flaky.exceptions)
        if found is None:
            raise
        raise ContractViolation(prop, pool, found.case, found.problems, intermittent=True) from None
    return count


def _first_violation(errors: Sequence[BaseException]) -> ContractViolation | None:
    for error in errors:
        if isinstance(error, ContractViolation):
            return error
        if isinstance(error, FlakyFailure):
            found = _first_violation(error.exceptions)
            if found is not None:
                return found
    return None


def _dtypes_of(value: object) -> set[str]:
    """The dtypes of every tensor an example (or a part of one) describes."""
    if isinstance(value, TensorSpec):
        return {value.dtype}
    kind = type(value)
    if attrs.has(kind):
        return set().union(*(_dtypes_of(getattr(value, f.name)) for f in attrs.fields(kind)))
    if isinstance(value, list | tuple | set | frozenset):
        return set().union(*(_dtypes_of(item) for item in value))
    if isinstance(value, dict):
        return set().union(*(_dtypes_of(item) for item in value.values()))
    return set()


def reproduce(
    target: str | StrategyFactory,
    case: Case,
    *,
    world_size: int,
    backend: str = "gloo",
    deadline: float = 30.0,
) -> None:
    """Run one example on a fresh pool, as a failure report prints it.

    Call it under ``if __name__ == "__main__":``: the ranks are started from a fork
    server, which imports the main module.

    Raises:
        ContractViolation: The example still breaks the contract.
    """
    with RankPool(
        StrategyTarget.of(target), world_size=world_size, backend=backend, deadline=deadline
    ) as pool:
        run_example(pool, property_of(case), case)
