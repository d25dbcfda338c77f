"""The suite as pytest tests: one test per property, per strategy, backend and world size.

Subclass `ConformanceSuite` in a test module of your own and name your strategy::

    from plait.conformance import ConformanceSuite

    class TestMyStrategy(ConformanceSuite):
        strategies = ("my_package.strategies:make_strategy",)
        world_sizes = (1, 2, 3, 4)  # keep a size that is not a power of two

or run the suite as it ships, naming the strategy on the command line::

    pytest --pyargs plait.conformance.suite --plait-strategy=my_package.strategies:make_strategy

The pytest plugin of ``plait-conformance`` (loaded when the distribution is installed)
turns each subclass into one group of tests per strategy x backend x world size (x
mesh), keeps one rank pool alive per group, and writes a JSON report per group.

A strategy whose ranks form a named device mesh declares the shapes to test it on;
its factory takes ``mesh_shape`` and builds the strategy's ``device_mesh`` from it,
with named dimensions that its collectives take as ``group=``::

    def make_strategy(mesh_shape: tuple[int, ...]) -> MyMeshStrategy:
        data, tensor = mesh_shape
        return MyMeshStrategy(data_parallel_size=data, tensor_parallel_size=tensor)

    class TestMyMeshStrategy(ConformanceSuite):
        strategies = ("my_package.strategies:make_strategy",)
        world_sizes = (2, 4)
        meshes = {4: ((2, 2), (1, 4)), 2: ((2, 1),)}

On each mesh every property runs over the whole job, then over each dimension the
mesh names: every group along it runs the example at once, its ranks numbered by
their place in the group (``src`` and the rows of ``all_gather``: the global rank at
that place), each group judged on its own. ``reduce_boolean_decision`` takes no
group, so it runs over the whole job only; ``point_to_point`` (the messages a
pipeline's stages pass, over the groups the mesh holds) runs along the dimensions only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import attrs
import pytest

from plait.conformance.properties import ContractViolation, prove
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.report import record
from plait.conformance.target import StrategyTarget
from plait.conformance.training.properties import prove_moves

if TYPE_CHECKING:
    from plait.conformance.cases import Case
    from plait.conformance.lane import Lane, PoolCache
    from plait.conformance.pool import MeshDimension, RankPool
    from plait.conformance.target import StrategyFactory

__all__ = ["ConformanceSuite", "Suite", "TestContract", "TestTraining", "TrainingSuite"]


def _only_violations(excinfo: pytest.ExceptionInfo[BaseException]) -> bool:
    """Hide the suite's frames from a violation, whose message says everything."""
    return excinfo.errisinstance(ContractViolation)


class Suite:
    """What the suites share: the strategies, lanes, and how a property is proved on a lane."""

    plait_conformance_suite: ClassVar[bool] = True
    strategies: ClassVar[Sequence[str | StrategyFactory]] = ()
    world_sizes: ClassVar[Sequence[int]] = (1, 2, 3)
    meshes: ClassVar[Mapping[int, Sequence[tuple[int, ...]]]] = {}
    backend: ClassVar[str] = "gloo"
    deadline: ClassVar[float] = 30.0
    start_timeout: ClassVar[float] = 120.0
    max_examples: ClassVar[int | None] = None
    training_examples: ClassVar[int | None] = None
    training_world_sizes: ClassVar[Sequence[int] | None] = None
    moves_world_sizes: ClassVar[Sequence[int] | None] = None
    resize_world_sizes: ClassVar[Sequence[int] | None] = None
    shrink: ClassVar[bool] = True

    def prove_property(self, name: str, request: pytest.FixtureRequest) -> None:
        """Prove the registered property ``name`` on this test's lane (and mesh dimensions).

        A suite's test of a property of your own kind calls it::

            def test_ping(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
                self.prove_property("ping", request)
        """
        __tracebackhide__ = _only_violations
        prop = EXAMPLE_KINDS.property(name)
        lane: Lane = request.getfixturevalue("plait_lane")
        if lane.world_size < prop.min_world_size:
            pytest.skip(f"{name} needs {prop.min_world_size} ranks or more")
        if not prop.over_job and not lane.target.mesh:
            pytest.skip(f"{name} runs along a mesh's dimensions: this lane has no mesh")
        training = prop.draws is not None
        if training:
            self._training_lane(lane)
        pool: RankPool = request.getfixturevalue("plait_pool")
        pools: PoolCache = request.getfixturevalue("plait_pools")
        examples = self._examples(request, training=training)
        seed: int = request.getfixturevalue("plait_seed")
        started = time.perf_counter()
        # Over the whole job; on a mesh, then over each dimension's groups.
        lanes: list[RankPool | MeshDimension] = [pool] if prop.over_job else []
        if prop.over_groups:
            lanes += [pool.along(dimension) for dimension in pool.dimensions]
        count = 0
        ran: list[Case] = []
        try:
            for each in lanes:
                if each.world_size < prop.min_world_size:
                    continue  # a dimension of one rank (the job has more)
                count += prove(
                    each,
                    prop,
                    max_examples=examples,
                    shrink=self.shrink,
                    seed=seed,
                    ran=ran,
                )
        except ContractViolation as violation:
            # A failure through a collective whose own property failed before it on
            # this lane is marked as that failure's likely consequence.
            failed = pools.failed.setdefault(lane, [])
            violation.follows(failed)
            failed.append(name)
            record(
                request.node,
                examples=violation.examples,
                seconds=time.perf_counter() - started,
                violation=violation.describe(),
            )
            raise
        over = None
        if pool.dimensions:
            dimensions = ", ".join(repr(dimension) for dimension in pool.dimensions)
            over = (
                ("the job, " if prop.over_job else "") + dimensions
                if prop.over_groups
                else "the job"
            )
        covered = EXAMPLE_KINDS.kind_of(ran[0]).covered(ran, pool.semantics) if ran else None
        record(
            request.node,
            examples=count,
            seconds=time.perf_counter() - started,
            over=over,
            covered=covered,
        )

    def _examples(self, request: pytest.FixtureRequest, *, training: bool) -> int:
        if training:
            given: int = request.getfixturevalue("plait_training_examples")
            return self.training_examples or given
        drawn: int = request.getfixturevalue("plait_examples")
        return self.max_examples or drawn

    def _training_lane(self, lane: Lane) -> None:
        sizes = self.training_world_sizes
        if sizes is not None and lane.world_size not in sizes:
            pytest.skip(
                f"{type(self).__name__} runs the training properties at world sizes "
                f"{', '.join(map(str, sizes))}"
            )


class ConformanceSuite(Suite):
    """Every property of the collective contract, for the strategies a subclass names.

    Attributes:
        strategies: What to test: registered names, ``"module:factory"`` references,
            or module-level factories. Empty means ``--plait-strategy``.
        world_sizes: The numbers of ranks to test at (``--plait-world-sizes``
            overrides them).
        backend: ``"gloo"`` (CPU), ``"gloo-cuda"`` (gloo with CUDA tensors, the ranks
            sharing the GPUs), ``"nccl"`` (CUDA) or ``"xla"`` (``--plait-backend``
            overrides it).
        deadline: Seconds an example may take before it counts as a hang
            (``--plait-deadline`` overrides it).
        start_timeout: Seconds the ranks may take to build the strategy and join its
            process group (``--plait-start-timeout`` overrides it).
        meshes: Per world size, the mesh shapes to build the strategy on (its
            factory is called with ``mesh_shape``), a lane each, instead of one lane
            without a mesh (``--plait-meshes`` overrides them); see above.
        max_examples: Drawn examples per property, after the grid; by default the
            ``--plait-profile``'s (25 for ``quick``, 200 for ``thorough``), or
            ``--plait-examples``. On a mesh lane, over the job and each dimension.
        shrink: Shrink a failing example to a minimal one. Shrinking an example
            that hangs costs a deadline per attempt.
    """

    def test_reduce_tensors(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Reduce of tensors: every op, dtype, shape and layout; exact or within rounding."""
        __tracebackhide__ = _only_violations
        self.prove_property("reduce_tensors", request)

    def test_reduce_numbers(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Reduce of Python numbers: Python numbers back, of the right type."""
        __tracebackhide__ = _only_violations
        self.prove_property("reduce_numbers", request)

    def test_broadcast(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """broadcast: src's value on every rank, tensors on the rank's device."""
        __tracebackhide__ = _only_violations
        self.prove_property("broadcast", request)

    def test_all_gather(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """all_gather: row i is rank i's tensor."""
        __tracebackhide__ = _only_violations
        self.prove_property("all_gather", request)

    def test_sub_groups(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Sub-groups: the contract among a group's ranks; outsiders are refused."""
        __tracebackhide__ = _only_violations
        self.prove_property("sub_groups", request)

    def test_reduce_boolean_decision(
        self, plait_lane: Lane, request: pytest.FixtureRequest
    ) -> None:
        """reduce_boolean_decision: logical all or any."""
        __tracebackhide__ = _only_violations
        self.prove_property("reduce_boolean_decision", request)

    def test_barrier(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """barrier: no rank leaves before every rank has entered."""
        __tracebackhide__ = _only_violations
        self.prove_property("barrier", request)

    def test_barrier_timeout(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """barrier(timeout=...): raises, naming the rank that never came."""
        __tracebackhide__ = _only_violations
        self.prove_property("barrier_timeout", request)

    def test_point_to_point(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Point-to-point along each mesh dimension: a pipeline's messages arrive whole."""
        __tracebackhide__ = _only_violations
        self.prove_property("point_to_point", request)

    def test_mismatch(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Mismatched calls: every rank raises CollectiveMismatchError, none hangs."""
        __tracebackhide__ = _only_violations
        self.prove_property("mismatch", request)

    def test_bad_arguments(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Bad arguments: the documented error on every rank, and the strategy still works."""
        __tracebackhide__ = _only_violations
        self.prove_property("bad_arguments", request)


class TestContract(ConformanceSuite):
    """The suite for the strategies named with ``--plait-strategy``."""


class TrainingSuite(Suite):
    """What a strategy does to training, for the strategies a subclass names.

    Subclass it beside (or with) `ConformanceSuite`; the strategy declares what it
    promises in ``training_semantics`` (`plait.core.TrainingSemantics`; synchronous
    replicas where it declares nothing)::

        class TestMyStrategyTrains(TrainingSuite):
            strategies = ("my_package.strategies:make_strategy",)

    Each property runs on the lane's rank pool (the collective suite's, where both
    run), on small runs Hypothesis draws: models (an MLP, a convolution, an
    embedding, a transformer block), batch sizes, accumulation windows, optimizers
    (SGD with momentum, Adam, LBFGS with a closure), schedulers (per step, per
    epoch, on plateau), the declared precisions and every registered checkpoint IO.
    What the strategy refuses with a `ConfigurationError` is drawn again.

    Attributes:
        training_examples: Drawn runs per property; by default the
            ``--plait-profile``'s (6 for ``quick``, 30 for ``thorough``), or
            ``--plait-examples``.
        training_world_sizes: The world sizes of the lanes the training properties
            run on, where a class that also runs the collective suite has more.
        moves_world_sizes: The world sizes of the lanes the moves run on (each
            starts the ranks of every compatible strategy); by default those of
            the other training properties.
        resize_world_sizes: Where a strategy declares itself ``resizable``, the
            world sizes its checkpoints move to from a moves lane (each starts its
            ranks there, on the strategy's own mesh where the lane has one); by
            default the training world sizes besides the lane's.
    """

    def test_declared_semantics(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Training gives what the strategy declares, loss by loss and replica by replica."""
        __tracebackhide__ = _only_violations
        self.prove_property("declared_semantics", request)

    def test_checkpoint_round_trip(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """A save and a load restore every state exactly, with every checkpoint IO."""
        __tracebackhide__ = _only_violations
        self.prove_property("checkpoint_round_trip", request)

    def test_resume_exactness(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """A run stopped anywhere and resumed goes on as if never stopped."""
        __tracebackhide__ = _only_violations
        self.prove_property("resume_exactness", request)

    def test_checkpoint_moves(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """A checkpoint goes on with the same losses on each strategy declared compatible.

        And, where the strategy is resizable, at other world sizes as one process on
        their global batch.
        """
        __tracebackhide__ = _only_violations
        self._training_lane(plait_lane)
        moves = self.moves_world_sizes
        if moves is not None and plait_lane.world_size not in moves:
            pytest.skip(
                f"{type(self).__name__} runs the moves at world sizes {', '.join(map(str, moves))}"
            )
        pool: RankPool = request.getfixturevalue("plait_pool")
        pools: PoolCache = request.getfixturevalue("plait_pools")
        examples = self._examples(request, training=True)
        seed: int = request.getfixturevalue("plait_seed")
        if not pool.semantics.compatible and not pool.semantics.resizable:
            pytest.skip(
                "the strategy declares no compatible strategy to move to, and is not resizable"
            )
        started = time.perf_counter()

        def target(name: str) -> RankPool:
            return pools.get(attrs.evolve(plait_lane, target=StrategyTarget(name)))

        def resized(world_size: int) -> RankPool:
            # On the strategy's own mesh there: a lane's mesh has its world size.
            own = attrs.evolve(plait_lane.target, mesh=())
            return pools.get(attrs.evolve(plait_lane, world_size=world_size, target=own))

        sizes = self.resize_world_sizes or self.training_world_sizes or self.world_sizes
        count = prove_moves(
            pool,
            target,
            max_examples=examples,
            shrink=self.shrink,
            seed=seed,
            resized_pool=resized,
            resize_to=sizes,
        )
        record(request.node, examples=count, seconds=time.perf_counter() - started)


class TestTraining(TrainingSuite):
    """The training properties for the strategies named with ``--plait-strategy``."""
