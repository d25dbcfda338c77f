"""A kind of example: its case, its property, what a rank runs and how it is judged.

Every example the ranks run is a frozen value (a case, `plait.conformance.cases`) of
a type that one `ExampleKind` answers for: which `Property` the example belongs to,
what each rank does with it (`ExampleKind.run`), and how the ranks' outcomes are
judged against the reference (`ExampleKind.judge`). The pool, the worker and the
judge know nothing of any kind beyond this: they look the kind up in
`plait.conformance.EXAMPLE_KINDS`. A new kind is one class and one registration::

    @attrs.frozen
    class PingCase:
        values: tuple[int, ...]

    class PingKind(CollectiveKind[PingCase]):
        case_type = PingCase
        properties = (Property("ping", "every rank gets the sum", pings),)

        def argument(self, case: PingCase, rank: int) -> object:
            return case.values[rank]

        def call(self, context: RankContext, case: PingCase, argument: object) -> object:
            return context.strategy.reduce(argument, reduce_op="sum")

        def judge(self, case, outcomes, devices) -> list[str]:
            want = sum(case.values)
            return [f"rank {o.rank}: got {o.result}" for o in outcomes if o.result != want]

    EXAMPLE_KINDS.register(PingKind())

(`plait.conformance.CollectiveKind` runs one collective call per rank, with the
contract's checks of inputs and results; `ExampleKind` itself lets a kind run
anything.)
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeVar

import attrs

from plait.conformance.cases import Case, dtypes_of
from plait.conformance.lanes import UNHELD_DTYPES
from plait.core import TrainingSemantics

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from hypothesis.strategies import SearchStrategy

    from plait.conformance.outcomes import Outcome
    from plait.conformance.target import StrategyTarget
    from plait.core import Strategy

__all__ = ["C", "ExampleKind", "Property", "RankContext"]

C = TypeVar("C", bound=Case)
"""The case type of a kind."""


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
        max_examples: A cap on drawn examples, for properties that restart the pool.
        grid: The explicit examples at a world size, run first in every run (see
            `plait.conformance.grid`).
        over_groups: Whether it also runs over a mesh dimension's groups (a
            collective without a ``group`` cannot).
        over_job: Whether the suite runs it over the whole job; ``False``: only
            along a mesh's dimensions, over groups the strategy builds (a lane
            without a mesh skips it).
        draws: Instead of ``cases``, the examples for a world size and what the
            strategy declares about training (the training properties).
        declared_grid: Instead of ``grid``, the explicit examples for a world size
            and what the strategy declares (a training property's runs reach the
            meetings it declares).
        slower: How many times the pool's deadline an example may take.
    """

    name: str
    contract: str
    cases: Callable[[int], SearchStrategy[Case]] | None = attrs.field(default=None, repr=False)
    min_world_size: int = attrs.field(default=1, repr=False)
    restarts_pool: bool = attrs.field(default=False, repr=False)
    max_examples: int | None = attrs.field(default=None, repr=False)
    grid: Callable[[int], Sequence[Case]] = attrs.field(default=lambda _world_size: (), repr=False)
    over_groups: bool = attrs.field(default=True, repr=False)
    over_job: bool = attrs.field(default=True, repr=False)
    draws: Callable[[int, TrainingSemantics], SearchStrategy[Case]] | None = attrs.field(
        default=None, repr=False
    )
    slower: float = attrs.field(default=1.0, repr=False)
    declared_grid: Callable[[int, TrainingSemantics], Sequence[Case]] | None = attrs.field(
        default=None, repr=False
    )

    def explicit(
        self,
        world_size: int,
        backend: str = "gloo",
        semantics: TrainingSemantics | None = None,
    ) -> list[Case]:
        """The grid's examples at ``world_size`` that the ``backend`` lane can hold.

        A property with a ``declared_grid`` takes them from it, for ``semantics``
        (the default, `plait.core.Synchronous`, where it is not given).
        """
        unheld = frozenset(UNHELD_DTYPES.get(backend, {}))
        if self.declared_grid is not None:
            grid = self.declared_grid(world_size, semantics or TrainingSemantics())
        else:
            grid = self.grid(world_size)
        return [case for case in grid if not dtypes_of(case) & unheld]


class RankContext(Protocol):
    """One rank's place in an example, and what a kind may use there.

    An example runs over the whole job, or along a mesh dimension (`dimension`): in
    every group of the dimension at once, where `rank` and `world_size` are the rank's
    place in its group and the group's size, as the example numbers its ranks.
    """

    @property
    def strategy(self) -> Strategy:
        """The strategy under test, joined to its process group."""
        ...

    @property
    def rank(self) -> int:
        """This rank's place in its group (its global rank over the whole job)."""
        ...

    @property
    def world_size(self) -> int:
        """The size of this rank's group."""
        ...

    @property
    def device(self) -> torch.device:
        """The strategy's ``root_device``."""
        ...

    @property
    def dimension(self) -> str | None:
        """The mesh dimension the example runs along (``None``: the whole job).

        Pass it as every collective's ``group``.
        """
        ...

    @property
    def global_rank(self) -> int:
        """This rank's number in the whole job."""
        ...

    @property
    def global_size(self) -> int:
        """The number of ranks in the whole job."""
        ...

    @property
    def evidence(self) -> dist.Store:
        """A store shared with the harness, for what a rank must record as it goes."""
        ...

    @property
    def key(self) -> str:
        """What tells this example and this rank's group apart in `evidence`'s keys."""
        ...

    @property
    def target(self) -> StrategyTarget | None:
        """How to build more strategies like this one (a training run builds fresh ones)."""
        ...

    def src(self, place: int) -> int:
        """The global rank at ``place`` of this rank's group (a place outside it, as is)."""
        ...

    def group(self, members: tuple[int, ...]) -> dist.ProcessGroup:
        """The process group of the ranks at places ``members`` of this rank's group.

        Every rank must call it, with the same ``members``: each makes every group.
        """
        ...

    def rejoin(self) -> None:
        """Build the pool's strategy anew, if a run ended its process group."""
        ...


class ExampleKind(abc.ABC, Generic[C]):
    """One kind of example: its case type, its properties, its rank part and its judge.

    Subclass it (or `plait.conformance.CollectiveKind`, for one collective call per
    rank) and register an instance in `plait.conformance.EXAMPLE_KINDS`; the pool,
    the worker and the judge then run and judge its cases as the built-in ones.

    Attributes:
        case_type: The frozen attrs class of its examples (one kind per type).
        properties: The properties whose examples are of this type (usually one).
        raises: Every rank's error is an expected result (a refused call, a
            timeout), not a failure in itself: `judge` says which errors are right.
        snippet_names: Names a reproduction snippet imports from the case type's
            module besides the case type (the values its ``repr`` holds); where
            ``plait.conformance`` exports every one (the built-in kinds'), it imports
            them from there.
    """

    case_type: type[C]
    properties: ClassVar[tuple[Property, ...]]
    raises: ClassVar[bool] = False
    snippet_names: ClassVar[tuple[str, ...]] = ()

    def property_of(self, case: C) -> Property:
        """The property ``case`` belongs to: the first of `properties` by default."""
        del case
        return self.properties[0]

    @abc.abstractmethod
    def run(self, context: RankContext, case: C) -> Outcome:
        """This rank's part of ``case``; an error it raises is reported, not raised."""

    @abc.abstractmethod
    def judge(self, case: C, outcomes: Sequence[Outcome], devices: Sequence[str]) -> list[str]:
        """How the ranks' outcomes break the contract; empty if they keep it.

        Args:
            case: The example every rank ran.
            outcomes: Each rank's outcome, in rank order (place order in a group).
            devices: Each rank's ``root_device``, as text.
        """

    def idle_places(self, case: C) -> frozenset[int]:
        """The places that call nothing in ``case``: their return says nothing of the others."""
        del case
        return frozenset()

    def takes_group(self, case: C) -> bool:
        """Whether every call of ``case`` takes a ``group`` (so it runs along a dimension)."""
        del case
        return True

    def for_group(self, case: C, *, group_size: int, world_size: int) -> C:
        """``case`` as every group of ``group_size`` ranks (of ``world_size``) runs it at once."""
        del group_size, world_size
        return case

    def checks_after(self, case: C, world_size: int) -> bool:
        """Whether every rank runs a plain reduce after ``case`` (its outcome's ``after``).

        Where ranks raise as they should, the strategy must still work afterwards.
        """
        del case, world_size
        return False

    def depends_on(
        self, case: C, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> tuple[str, ...]:
        """The properties whose failure a failure of ``case`` likely follows from."""
        del case, outcomes, devices
        return ()

    def labels(self, case: C) -> dict[str, object]:
        """What a reader filters failures of ``case`` by, beyond its type, src and dtypes."""
        del case
        return {}

    def refusal(self, outcomes: Sequence[Outcome]) -> str | None:
        """Why every rank refused the example's settings alike, if it did: draw another."""
        del outcomes
        return None

    def covered(self, cases: Sequence[C], semantics: TrainingSemantics) -> str | None:
        """What the examples of a property that ran covered, in words (None: nothing to say).

        ``semantics`` is what the strategy declares about training. The suite's
        summary prints it under the lane's line.
        """
        del cases, semantics
        return None
