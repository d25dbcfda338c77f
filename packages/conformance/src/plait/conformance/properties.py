"""Proving a property: examples run on a pool, judged, and a violation reported with a snippet.

The contract's properties are their kinds' (`plait.conformance.kinds`, listed in
`PROPERTIES`); what runs and judges an example is its kind, looked up in
`plait.conformance.EXAMPLE_KINDS`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import FlakyFailure, Unsatisfiable

from plait.conformance.cases import TensorSpec, dtypes_of
from plait.conformance.kind import Property
from plait.conformance.kinds import PROPERTIES
from plait.conformance.kinds.reduce import ReduceCase
from plait.conformance.lanes import UNHELD_DTYPES
from plait.conformance.outcomes import Outcome, rank_list
from plait.conformance.pool import (
    GroupOutcomes,
    MeshDimension,
    PoolError,
    PoolStartError,
    RankHangError,
    RankPool,
)
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import check
from plait.conformance.target import StrategyFactory, StrategyTarget
from plait.core import ConfigurationError

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from plait.conformance.cases import Case

__all__ = [
    "PROPERTIES",
    "ContractViolation",
    "Property",
    "Refusal",
    "drawing",
    "plain",
    "property_of",
    "prove",
    "reproduce",
    "run_example",
]


def property_of(case: Case) -> Property:
    """The property whose examples look like ``case`` (its kind says)."""
    return EXAMPLE_KINDS.kind_of(case).property_of(case)


_INTERMITTENT: Final = (
    "This example broke the contract once but not when it was run again: the flaw "
    "depends on timing or on what ran before it, so the snippet may need a few runs "
    "to show it."
)


class ContractViolation(AssertionError):  # noqa: N818 - a failed property, as pytest shows it
    """A strategy broke the contract on one example; the message says how to rerun it.

    The message's first line is the property, the lane and the first thing that went
    wrong (or, for a consequence, the failure it follows from); then the rest of what
    each rank did wrong, the contract, where the example came from, and a snippet.

    Attributes:
        property: The property's name.
        strategy: The strategy's spec, as the pool was given it.
        backend: The lane.
        world_size: The number of ranks.
        case: The example.
        problems: What each rank did wrong (ranks that did alike are said once).
        intermittent: The example broke the contract once but not when it was run
            again (a flaw that depends on timing or on what ran before).
        seed: The seed the examples were drawn from, when it is known.
        explicit: The example is on the property's grid, which every run tries first.
        examples: How many examples had run when it was found (`prove` sets it).
        depends_on: The properties that prove the collectives this failure went
            through (a plain reduce run after ranks raised is ``reduce_tensors``'s).
        consequence_of: Those of them that failed before it on the same lane: this
            failure likely follows from theirs (the suite sets it).
    """

    def __init__(
        self,
        prop: Property,
        pool: RankPool | MeshDimension,
        case: Case,
        problems: list[str],
        *,
        intermittent: bool = False,
        depends_on: tuple[str, ...] = (),
    ) -> None:
        self.property = prop.name
        self.contract = prop.contract
        self.strategy = pool.target.spec
        self.strategy_name = pool.target.name
        self.backend = pool.backend
        self.world_size = pool.world_size
        self.where = pool.where
        self.rerun: dict[str, object] = pool.rerun
        self.case = case
        self.problems = merge_ranks(problems, pool.world_size)
        self.intermittent = intermittent
        self.seed: int | None = None
        self.explicit = False
        self.examples: int | None = None
        self.depends_on = depends_on
        self.consequence_of: tuple[str, ...] = ()
        super().__init__(self._message())

    def locate(self, *, seed: int | None, explicit: bool) -> None:
        """Say where the example came from: the grid, or the draws of ``seed``."""
        self.seed = seed
        self.explicit = explicit
        self.args = (self._message(),)

    def follows(self, failed: Sequence[str]) -> None:
        """Mark this failure a consequence of those of ``failed`` it depends on.

        ``failed`` are the properties that failed before it on the same lane.
        """
        self.consequence_of = tuple(name for name in self.depends_on if name in failed)
        self.args = (self._message(),)

    @property
    def headline(self) -> str:
        """The first line of the message: what failed, where, and the first problem."""
        where = f"{self.property} failed for {self.strategy_name!r} ({self.where})"
        first = self.problems[0].splitlines()[0] if self.problems else ""
        if self.consequence_of:
            roots = " and ".join(self.consequence_of)
            return (
                f"{where}, likely a consequence of {roots}, which failed before it on this "
                f"lane through the same collective (fix that first): {first}"
            )
        return f"{where}: {first}"

    @property
    def snippet(self) -> str:
        """A script that reruns this one example (save it as a file and run it)."""
        case_type = type(self.case)
        kind = EXAMPLE_KINDS.kind_of(self.case)
        names = sorted({case_type.__name__, *kind.snippet_names})
        module = case_type.__module__
        package = sys.modules.get("plait.conformance")
        if package is not None and all(hasattr(package, name) for name in names):
            module = "plait.conformance"  # a built-in kind's names, where users import them
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.rerun.items())
        return "\n".join(
            [
                "from plait.conformance import reproduce",
                f"from {module} import {', '.join(names)}",
                "",
                'if __name__ == "__main__":',
                f"    reproduce({self.strategy!r}, {self.case!r}, {arguments})",
            ]
        )

    def _origin(self) -> list[str]:
        if self.explicit:
            return ["This example is on the property's grid: every run tries it first."]
        if self.seed is not None:
            again = f"rerun the property with --plait-seed={self.seed} to draw it again"
            return [f"Drawn from seed {self.seed}: {again}."]
        return []

    def _message(self) -> str:
        _, *rest_of_first = self.problems[0].splitlines() if self.problems else [""]
        lines = [
            self.headline,
            *rest_of_first,
            *(f"  - {problem}" for problem in self.problems[1:]),
            f"The property: {self.contract}.",
            *([_INTERMITTENT] if self.intermittent else []),
            *self._origin(),
            "Run this example alone:",
            *(f"    {line}" if line else "" for line in self.snippet.splitlines()),
        ]
        return "\n".join(lines)

    def describe(self) -> dict[str, object]:
        """The violation as plain data, for reports."""
        return {
            "property": self.property,
            "strategy": self.strategy,
            "backend": self.backend,
            "world_size": self.world_size,
            "lane": self.where,
            **{key: value for key, value in self.rerun.items() if key in ("mesh", "dimension")},
            "case": repr(self.case),
            **_labels_of(self.case),
            "problems": list(self.problems),
            "headline": self.headline,
            "consequence_of": list(self.consequence_of),
            "intermittent": self.intermittent,
            "explicit": self.explicit,
            "seed": self.seed,
            "examples": self.examples,
            "snippet": self.snippet,
        }


_RANK: Final = re.compile(r"rank (\d+)(:? .*)", re.DOTALL)


def merge_ranks(problems: Sequence[str], world_size: int) -> list[str]:
    """``problems`` with those that differ only in the rank said once, in order.

    ``rank 0: x`` and ``rank 1: x`` become ``ranks 0 and 1: x``, or ``every rank: x``
    where every rank of the world said it.
    """
    ranks: dict[str, list[int]] = {}
    order: list[str] = []
    for problem in problems:
        found = _RANK.fullmatch(problem)
        key = found.group(2) if found else problem
        if key not in ranks:
            ranks[key] = []
            order.append(key)
        if found:
            ranks[key].append(int(found.group(1)))
    merged = []
    for key in order:
        who = ranks[key]
        if not who:
            merged.append(key)
        elif len(who) > 1 and sorted(who) == list(range(world_size)):
            merged.append(f"every rank{key}")
        else:
            merged.append(f"{rank_list(who)}{key}")
    return merged


def _labels_of(case: Case) -> dict[str, object]:
    """What a reader filters failures by: the kind, what its kind adds (the op), src, dtypes."""
    labels: dict[str, object] = {
        "kind": type(case).__name__,
        **EXAMPLE_KINDS.kind_of(case).labels(case),
    }
    src = getattr(case, "src", None)
    if isinstance(src, int):
        labels["src"] = src
    dtypes = sorted(dtypes_of(case))
    if dtypes:
        labels["dtypes"] = dtypes
    return labels


class Refusal(Exception):  # noqa: N818 - the strategy's answer, not an error of the kit
    """Every rank refused a training example's settings with the same `ConfigurationError`.

    A strategy may refuse what it cannot do (LBFGS on sharded parameters, a checkpoint
    IO that writes on rank 0 for shards): `prove` draws another example instead.
    """


class _Hung(BaseException):
    """Carries a hang out of Hypothesis, which would shrink it at a deadline per try."""

    def __init__(self, violation: ContractViolation) -> None:
        super().__init__(str(violation))
        self.violation = violation


def _sync_case(world_size: int) -> ReduceCase:
    return ReduceCase(
        "sum", tuple(TensorSpec("int64", (1,), (rank,)) for rank in range(world_size))
    )


def run_example(pool: RankPool | MeshDimension, prop: Property, case: Case) -> None:
    """Run ``case`` on every rank of ``pool`` and judge it against the reference.

    Over a mesh dimension (`RankPool.along`), each group's outcomes are judged on
    their own, and a problem names the group it happened in.

    Raises:
        ContractViolation: The outcomes differ from the reference, a rank died, or
            the strategy stopped working after ranks raised.
        _Hung: A rank hung (`prove` turns it into a `ContractViolation`).
    """
    __tracebackhide__ = True
    case = pool.prepare(case)
    try:
        groups = pool.run_groups(case, slower=prop.slower)
    except RankHangError as error:
        raise _Hung(ContractViolation(prop, pool, case, [str(error)])) from None
    except (PoolError, PoolStartError) as error:
        raise ContractViolation(prop, pool, case, [str(error)]) from None
    refused = EXAMPLE_KINDS.kind_of(case).refusal(
        [outcome for group in groups for outcome in group.outcomes]
    )
    if refused is not None:
        raise Refusal(refused)
    judged = [_judge(prop, case, group) for group in groups]
    problems = [problem for found, _ in judged for problem in found]
    depends_on = next((parts for found, parts in judged if found), ())
    if prop.restarts_pool:
        pool.restart()
    if problems:
        raise ContractViolation(prop, pool, case, problems, depends_on=depends_on)


def _judge(prop: Property, case: Case, group: GroupOutcomes) -> tuple[list[str], tuple[str, ...]]:
    """One group's problems with ``case``, and the properties they likely follow from."""
    outcomes, devices = group.outcomes, group.devices
    kind = EXAMPLE_KINDS.kind_of(case)
    problems = check(case, outcomes, devices)
    depends_on: tuple[str, ...] = ()
    if problems:
        depends_on = kind.depends_on(case, outcomes, devices)
    elif not prop.restarts_pool and kind.checks_after(case, len(outcomes)):
        # Where ranks raised as they should, the strategy must still work: every
        # rank ran a plain reduce after the example, in the same message.
        after = [
            Outcome(outcome.rank, result=outcome.after, error=outcome.after_error)
            for outcome in outcomes
        ]
        if any(outcome.error for outcome in outcomes):
            failed = check(_sync_case(len(outcomes)), after, devices)
            problems = [_after_raising(text) for text in failed]
            depends_on = ("reduce_tensors",)
    return [group.named(problem) for problem in problems], depends_on


def _after_raising(problem: str) -> str:
    found = _RANK.fullmatch(problem)
    if found is None:
        return f"after the ranks raised, a plain reduce failed: {problem}"
    return f"rank {found.group(1)}: after the ranks raised, a plain reduce failed{found.group(2)}"


def prove(
    pool: RankPool | MeshDimension,
    prop: Property,
    *,
    max_examples: int,
    shrink: bool = True,
    seed: int | None = None,
    grid: bool = True,
    ran: list[Case] | None = None,
) -> int:
    """Run ``prop`` on its grid, then on up to ``max_examples`` drawn examples.

    The grid (`Property.explicit`) runs first, in order, the same in every run
    (``grid=False`` leaves it out, for a run of drawn examples only);
    then Hypothesis draws examples, from ``seed`` when it is given (the same seed
    draws the same examples), and on a failure shrinks it to a minimal one, which
    `ContractViolation` prints with a snippet that reruns it alone. A hang is
    reported as first found: each try at shrinking it would cost the pool's
    deadline. An example that fails once and passes when run again (a flaw that
    shows only under some timing) is still a violation: it is reported as found,
    marked intermittent, never passed over.

    Every example that ran (none refused) is added to ``ran`` where it is given.

    Returns:
        How many examples ran: the grid's and the drawn ones.

    Raises:
        ContractViolation: An example broke the contract.
    """
    __tracebackhide__ = True
    count = 0
    refused: list[tuple[Case, str]] = []
    limit = min(max_examples, prop.max_examples or max_examples)
    cases, explicit = _examples(pool, prop, grid=grid)
    grid_left = list(explicit)  # while any is left, a refused example is passed over

    def run(case: Case) -> None:
        __tracebackhide__ = True
        nonlocal count
        try:
            run_example(pool, prop, case)
        except Refusal as refusal:
            refused.append((case, str(refusal)))
            if grid_left:
                return  # a grid example the strategy does not take: the next one
            reject()  # the strategy does not take these settings: draw others
        except (ContractViolation, _Hung) as failure:
            count += 1
            found = failure.violation if isinstance(failure, _Hung) else failure
            found.locate(seed=seed, explicit=case in explicit)
            found.examples = count
            raise
        count += 1
        if ran is not None:
            ran.append(case)

    # The grid runs first, in a plain loop: as Hypothesis's explicit examples would
    # (once each, in order, never shrunk), without its cost per example, which is
    # about that of the example itself.
    try:
        while grid_left:
            run(grid_left[0])
            grid_left.pop(0)
    except _Hung as hung:
        raise plain(hung.violation) from None
    except ContractViolation as violation:
        raise plain(violation) from None
    test = drawing(run, cases, limit=limit, shrink=shrink, seed=seed)
    try:
        test()
    except Unsatisfiable:
        raise _refused_everything(prop, pool, refused) from None
    except _Hung as hung:
        raise plain(hung.violation) from None
    except ContractViolation as violation:
        raise plain(violation) from None
    except FlakyFailure as flaky:
        raise _intermittent(prop, pool, flaky, seed, count) from None
    return count


def _intermittent(
    prop: Property,
    pool: RankPool | MeshDimension,
    flaky: FlakyFailure,
    seed: int | None,
    count: int,
) -> BaseException:
    """A violation found once and not again, as a violation marked intermittent."""
    found = _first_violation(flaky.exceptions)
    if found is None:
        return flaky
    again = ContractViolation(
        prop, pool, found.case, found.problems, intermittent=True, depends_on=found.depends_on
    )
    again.locate(seed=seed, explicit=found.explicit)
    again.examples = count
    return again


def _refused_everything(
    prop: Property, pool: RankPool | MeshDimension, refused: list[tuple[Case, str]]
) -> ContractViolation:
    case, why = refused[-1]
    return ContractViolation(
        prop,
        pool,
        case,
        [
            (
                f"the strategy refused every one of the {len(refused)} examples it was "
                f"given with a ConfigurationError, so nothing was proved; the last: {why}"
            )
        ],
    )


def drawing(
    run: Callable[[Case], None],
    cases: SearchStrategy[Case],
    *,
    limit: int,
    shrink: bool,
    seed: int | None,
) -> Callable[[], None]:
    """``run`` over up to ``limit`` examples Hypothesis draws from ``cases``."""
    phases = [Phase.reuse, Phase.generate, *([Phase.shrink] if shrink else [])]
    test = given(case=cases)(run)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    drawn: Callable[[], None] = settings(
        max_examples=limit,
        deadline=None,
        database=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )(test)
    return drawn


def _examples(
    pool: RankPool | MeshDimension, prop: Property, *, grid: bool
) -> tuple[SearchStrategy[Case], list[Case]]:
    """What ``prop`` draws its examples from on ``pool``'s lane, and its grid there."""
    if isinstance(pool, MeshDimension) and not prop.over_groups:
        raise ConfigurationError(
            f"{prop.name} cannot run over the mesh dimension {pool.dimension!r}: its "
            "collective takes no group",
            value=prop.name,
            fix="prove it on the pool itself (over the whole job)",
        )
    whole = pool.pool if isinstance(pool, MeshDimension) else pool
    if prop.draws is not None or prop.declared_grid is not None:
        whole.start()  # what the strategy declares is known once its ranks are up
    semantics = whole.semantics
    if prop.draws is not None:
        cases = prop.draws(pool.world_size, semantics)
    else:
        assert prop.cases is not None, f"{prop.name} has neither cases nor draws"
        cases = prop.cases(pool.world_size)
    unheld = frozenset(UNHELD_DTYPES.get(pool.backend, {}))
    if unheld:  # the lane's devices cannot hold them: no example may use them
        cases = cases.filter(lambda case: not dtypes_of(case) & unheld)
    explicit = prop.explicit(pool.world_size, pool.backend, semantics) if grid else []
    if isinstance(pool, MeshDimension):  # no call without a group: it would span the job
        cases = cases.filter(_takes_group)
        explicit = [case for case in explicit if _takes_group(case)]
    return cases, explicit


def _takes_group(case: Case) -> bool:
    """Whether every call of ``case`` takes a group (a decision takes none)."""
    return EXAMPLE_KINDS.kind_of(case).takes_group(case)


def plain(violation: ContractViolation) -> ContractViolation:
    """The violation without the frames and notes of the machinery that found it.

    Hypothesis adds a note repeating the example, and its frames and the suite's
    own stand between the test and the message: an author reads the message first.
    """
    if hasattr(violation, "__notes__"):
        del violation.__notes__
    return violation.with_traceback(None)


def _first_violation(errors: Sequence[BaseException]) -> ContractViolation | None:
    for error in errors:
        if isinstance(error, ContractViolation):
            return error
        if isinstance(error, FlakyFailure):
            found = _first_violation(error.exceptions)
            if found is not None:
                return found
    return None


def reproduce(
    target: str | StrategyFactory,
    case: Case,
    *,
    world_size: int,
    backend: str = "gloo",
    deadline: float = 30.0,
    mesh: tuple[int, ...] = (),
    dimension: str | None = None,
) -> None:
    """Run one example on a fresh pool, as a failure report prints it.

    Call it under ``if __name__ == "__main__":``: the ranks are started from a fork
    server, which imports the main module. With ``mesh``, the strategy is built on
    that mesh; with ``dimension`` too, the example runs over that dimension's groups.

    Raises:
        ContractViolation: The example still breaks the contract.
    """
    with RankPool(
        StrategyTarget.of(target),
        world_size=world_size,
        backend=backend,
        deadline=deadline,
        mesh=mesh,
    ) as pool:
        lane = pool if dimension is None else pool.along(dimension)
        run_example(lane, property_of(case), case)
