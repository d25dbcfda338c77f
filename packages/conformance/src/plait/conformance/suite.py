"""The suite as pytest tests: one test per property, per strategy, backend and world size.

Subclass `ConformanceSuite` in a test module of your own and name your strategy::

    from plait.conformance import ConformanceSuite

    class TestMyStrategy(ConformanceSuite):
        strategies = ("my_package.strategies:make_strategy",)
        world_sizes = (1, 2, 4)

or run the suite as it ships, naming the strategy on the command line::

    pytest --pyargs plait.conformance.suite --plait-strategy=my_package.strategies:make_strategy

The pytest plugin of ``plait-conformance`` (loaded when the distribution is installed)
turns each subclass into one group of tests per strategy x backend x world size,
keeps one rank pool alive per group, and writes a JSON report per group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import pytest

from plait.conformance.properties import PROPERTIES, Property, prove

if TYPE_CHECKING:
    from plait.conformance.pool import RankPool
    from plait.conformance.target import StrategyFactory

__all__ = ["ConformanceSuite", "TestContract"]

_PROPERTIES = {prop.name: prop for prop in PROPERTIES}


class ConformanceSuite:
    """Every property of the collective contract, for the strategies a subclass names.

    Attributes:
        strategies: What to test: registered names, ``"module:factory"`` references,
            or module-level factories. Empty means ``--plait-strategy``.
        world_sizes: The numbers of ranks to test at (``--plait-world-sizes``
            overrides them).
        backend: ``"gloo"`` (CPU), ``"nccl"`` (CUDA) or ``"xla"`` (``--plait-backend``
            overrides it).
        deadline: Seconds an example may take before it counts as a hang.
        max_examples: Examples per property; by default the ``--plait-profile``'s
            (25 for ``quick``, 200 for ``thorough``), or ``--plait-examples``.
        shrink: Shrink a failing example to a minimal one. Shrinking an example
            that hangs costs a deadline per attempt.
    """

    plait_conformance_suite: ClassVar[bool] = True
    strategies: ClassVar[Sequence[str | StrategyFactory]] = ()
    world_sizes: ClassVar[Sequence[int]] = (1, 2)
    backend: ClassVar[str] = "gloo"
    deadline: ClassVar[float] = 30.0
    max_examples: ClassVar[int | None] = None
    shrink: ClassVar[bool] = True

    def _prove(
        self, name: str, pool: RankPool, examples: int, request: pytest.FixtureRequest
    ) -> None:
        prop: Property = _PROPERTIES[name]
        if pool.world_size < prop.min_world_size:
            pytest.skip(f"{name} needs {prop.min_world_size} ranks or more")
        count = prove(pool, prop, max_examples=self.max_examples or examples, shrink=self.shrink)
        request.node.user_properties.append(("plait_examples", count))

    def test_reduce_tensors(
        self, plait_pool: RankPool, plait_examples: int, request: pytest.FixtureRequest
    ) -> None:
        """Reduce of tensors: every op, dtype, shape and layout; exact or within rounding."""
        self._prove("reduce_tensors", plait_pool, plait_examples, request)

    def test_reduce_numbers(
        self, plait_pool: RankPool, plait_examples: int, request: pytest.FixtureRequest
    ) -> None:
        """Reduce of Python numbers: Python numbers back, of the right type."""
        self._prove("reduce_numbers", plait_pool, plait_examples, request)

    def test_broadcast(
        self, plait_pool: RankPool, plait_examples: int, request: pytest.FixtureRequest
    ) -> None:
        """broadcast: src's value on every rank, tensors on the rank's device."""
        self._prove("broadcast", plait_pool, plait_examples, request)

    def test_all_gather(
        self, plait_pool: RankPool, plait_examples: int, request: pytest.FixtureRequest
    ) -> None:
        """all_gather: row i is rank i's tensor."""
        self._prove("all_gather", plait_pool, plait_examples, request)

    def test_sub_groups(
        self, plait_pool: RankPool, plait_examples: int, request: pytest.FixtureRequest
    ) -> None:
        """Sub-groups: the contract among a group's ranks; outsiders are refused."""
        self._prove("sub_groups", plait_pool, plait_examples, request)

    def test_reduce_boolean_decision(
        self, plait_pool: RankPool, plait_examples: int, request: pytest.FixtureRequest
    ) -> None:
        """reduce_boolean_decision: logical all or any."""
        self._prove("reduce_boolean_decision", plait_pool, plait_examples, request)

    def test_barrier(
        self, plait_pool: RankPool, plait_examples: int, request: pytest.FixtureRequest
    ) -> None:
        """barrier: no rank leaves before every rank has entered."""
        self._prove("barrier", plait_pool, plait_examples, request)

    def test_barrier_timeout(
        self, plait_pool: RankPool, plait_examples: int, request: pytest.FixtureRequest
    ) -> None:
        """barrier(timeout=...): raises, naming the rank that never came."""
        self._prove("barrier_timeout", plait_pool, plait_examples, request)

    def test_mismatch(
        self, plait_pool: RankPool, plait_examples: int, request: pytest.FixtureRequest
    ) -> None:
        """Mismatched calls: every rank raises CollectiveMismatchError, none hangs."""
        self._prove("mismatch", plait_pool, plait_examples, request)

    def test_bad_arguments(
        self, plait_pool: RankPool, plait_examples: int, request: pytest.FixtureRequest
    ) -> None:
        """Bad arguments: the documented error on every rank, and the strategy still works."""
        self._prove("bad_arguments", plait_pool, plait_examples, request)


class TestContract(ConformanceSuite):
    """The suite for the strategies named with ``--plait-strategy``."""
