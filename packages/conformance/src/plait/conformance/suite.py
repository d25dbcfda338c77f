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
group, so it runs over the whole job only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import pytest

from plait.conformance.properties import PROPERTIES, ContractViolation, Property, prove

if TYPE_CHECKING:
    from plait.conformance.plugin import Lane, PoolCache
    from plait.conformance.pool import MeshDimension, RankPool
    from plait.conformance.target import StrategyFactory

__all__ = ["ConformanceSuite", "TestContract"]

_PROPERTIES = {prop.name: prop for prop in PROPERTIES}


def _only_violations(excinfo: pytest.ExceptionInfo[BaseException]) -> bool:
    """Hide the suite's frames from a violation, whose message says everything."""
    return excinfo.errisinstance(ContractViolation)


class ConformanceSuite:
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

    plait_conformance_suite: ClassVar[bool] = True
    strategies: ClassVar[Sequence[str | StrategyFactory]] = ()
    world_sizes: ClassVar[Sequence[int]] = (1, 2, 3)
    meshes: ClassVar[Mapping[int, Sequence[tuple[int, ...]]]] = {}
    backend: ClassVar[str] = "gloo"
    deadline: ClassVar[float] = 30.0
    start_timeout: ClassVar[float] = 120.0
    max_examples: ClassVar[int | None] = None
    shrink: ClassVar[bool] = True

    def _prove(self, name: str, request: pytest.FixtureRequest) -> None:
        __tracebackhide__ = _only_violations
        prop: Property = _PROPERTIES[name]
        lane: Lane = request.getfixturevalue("plait_lane")
        if lane.world_size < prop.min_world_size:
            pytest.skip(f"{name} needs {prop.min_world_size} ranks or more")
        pool: RankPool = request.getfixturevalue("plait_pool")
        pools: PoolCache = request.getfixturevalue("plait_pools")
        examples: int = request.getfixturevalue("plait_examples")
        seed: int = request.getfixturevalue("plait_seed")
        labels = request.node.user_properties
        started = time.perf_counter()
        # Over the whole job; on a mesh, then over each dimension's groups.
        lanes: list[RankPool | MeshDimension] = [pool]
        if prop.over_groups:
            lanes += [pool.along(dimension) for dimension in pool.dimensions]
        count = 0
        try:
            for each in lanes:
                if each.world_size < prop.min_world_size:
                    continue  # a dimension of one rank (the job has more)
                count += prove(
                    each,
                    prop,
                    max_examples=self.max_examples or examples,
                    shrink=self.shrink,
                    seed=seed,
                )
        except ContractViolation as violation:
            # A failure through a collective whose own property failed before it on
            # this lane is marked as that failure's likely consequence.
            failed = pools.failed.setdefault(lane, [])
            violation.follows(failed)
            failed.append(name)
            labels.append(("plait_examples", violation.examples))
            labels.append(("plait_seconds", time.perf_counter() - started))
            labels.append(("plait_violation", violation.describe()))
            raise
        labels.append(("plait_examples", count))
        if pool.dimensions:
            over = ", ".join(repr(dimension) for dimension in pool.dimensions)
            labels.append(("plait_over", f"the job, {over}" if prop.over_groups else "the job"))
        labels.append(("plait_seconds", time.perf_counter() - started))

    def test_reduce_tensors(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Reduce of tensors: every op, dtype, shape and layout; exact or within rounding."""
        __tracebackhide__ = _only_violations
        self._prove("reduce_tensors", request)

    def test_reduce_numbers(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Reduce of Python numbers: Python numbers back, of the right type."""
        __tracebackhide__ = _only_violations
        self._prove("reduce_numbers", request)

    def test_broadcast(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """broadcast: src's value on every rank, tensors on the rank's device."""
        __tracebackhide__ = _only_violations
        self._prove("broadcast", request)

    def test_all_gather(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """all_gather: row i is rank i's tensor."""
        __tracebackhide__ = _only_violations
        self._prove("all_gather", request)

    def test_sub_groups(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Sub-groups: the contract among a group's ranks; outsiders are refused."""
        __tracebackhide__ = _only_violations
        self._prove("sub_groups", request)

    def test_reduce_boolean_decision(
        self, plait_lane: Lane, request: pytest.FixtureRequest
    ) -> None:
        """reduce_boolean_decision: logical all or any."""
        __tracebackhide__ = _only_violations
        self._prove("reduce_boolean_decision", request)

    def test_barrier(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """barrier: no rank leaves before every rank has entered."""
        __tracebackhide__ = _only_violations
        self._prove("barrier", request)

    def test_barrier_timeout(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """barrier(timeout=...): raises, naming the rank that never came."""
        __tracebackhide__ = _only_violations
        self._prove("barrier_timeout", request)

    def test_mismatch(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Mismatched calls: every rank raises CollectiveMismatchError, none hangs."""
        __tracebackhide__ = _only_violations
        self._prove("mismatch", request)

    def test_bad_arguments(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        """Bad arguments: the documented error on every rank, and the strategy still works."""
        __tracebackhide__ = _only_violations
        self._prove("bad_arguments", request)


class TestContract(ConformanceSuite):
    """The suite for the strategies named with ``--plait-strategy``."""
