"""The pytest plugin: rank pools as fixtures, lanes as test groups, expectations.

Loaded through the ``pytest11`` entry point of ``plait-conformance``. It only acts
on subclasses of `plait.conformance.ConformanceSuite`; other tests are untouched.
Its options are read once into `plait.conformance.options.Options`; its reports are
`plait.conformance.report`'s.
"""

from __future__ import annotations

import difflib
import math
import os
import sys
import warnings
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import pytest

from plait.conformance.lane import Lane, LaneDown, PoolCache
from plait.conformance.lanes import backend_unavailable
from plait.conformance.options import (
    PROFILES,
    SEED_VARIABLE,
    TRAINING_PROFILES,
    Expectation,
    Options,
    add_options,
    keep,
    options_of,
)
from plait.conformance.pool import PoolStartError, RankPool, preload
from plait.conformance.report import LANE, PROPERTY, STARTED, Reporter
from plait.conformance.target import StrategyTarget
from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.conformance.suite import Suite
    from plait.conformance.target import StrategyFactory

__all__ = [
    "PROFILES",
    "SEED_VARIABLE",
    "TRAINING_PROFILES",
    "ExpectationWarning",
    "Lane",
    "LaneDown",
    "PoolCache",
    "Reporter",
]

_SHIPPED_SUITE: Final = Path(__file__).with_name("suite.py").resolve()


class ExpectationWarning(pytest.PytestWarning):
    """An entry of the expectations file matched no test of a lane that ran."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--plait-*`` options."""
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Check the options early, choose the seed and read the expectations file."""
    options = Options.read(config)
    keep(config, options)
    try:
        preload(*config.getini("plait_preload"))
    except ConfigurationError as error:
        raise pytest.UsageError(f"the plait_preload ini option: {error}") from error
    # Each lane's tests carry xdist's group marker so that one worker runs a lane;
    # the marker means nothing without pytest-xdist, which then does not see it.
    if options.xdist:
        config.addinivalue_line(
            "markers", "xdist_group(name): run these tests on one pytest-xdist worker"
        )
    os.environ[SEED_VARIABLE] = str(options.seed)  # inherited by pytest-xdist's workers
    for spec in options.strategies:
        try:
            StrategyTarget.of(spec).factory()
        except Exception as error:  # noqa: PERF203 - the first bad one ends the run
            raise pytest.UsageError(f"--plait-strategy={spec}: {error}") from error
    config.pluginmanager.register(Reporter(config), "plait-conformance-reporter")


def pytest_report_header(config: pytest.Config) -> str:
    """The seed of this run, and how to draw the same examples again."""
    seed = options_of(config).seed
    return f"plait conformance: seed {seed} (--plait-seed={seed} draws the same examples)"


def _targets(config: pytest.Config, cls: type[Suite]) -> list[StrategyTarget]:
    given: Sequence[str | StrategyFactory] = cls.strategies or options_of(config).strategies
    if not given:
        raise pytest.UsageError(
            f"{cls.__name__} names no strategy: pass --plait-strategy=NAME (a registered "
            "name, 'package.module:factory' or 'path/file.py:factory'), or set "
            f"{cls.__name__}.strategies"
        )
    try:
        targets = [StrategyTarget.of(item) for item in given]
        for target in targets:
            target.factory()  # fails now, naming the problem, not once per rank
    except Exception as error:
        raise pytest.UsageError(f"{cls.__name__}: {error}") from error
    return targets


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One group of tests per strategy x backend x world size of each suite."""
    cls = metafunc.cls
    # A marker, not issubclass: pytest may import the shipped suite module a second
    # time under another name (``--pyargs`` in a namespace package).
    suite = getattr(cls, "plait_conformance_suite", False) is True
    if cls is None or not suite or LANE not in metafunc.fixturenames:
        return
    config = metafunc.config
    options = options_of(config)
    backend = options.backend or cls.backend
    sizes = options.world_sizes or tuple(cls.world_sizes)
    deadline = options.deadline or cls.deadline
    start = options.start_timeout or cls.start_timeout
    declared = options.meshes
    meshes = declared if declared is not None else _declared_meshes(cls)
    lanes = [
        Lane(attrs.evolve(target, mesh=mesh), backend, size, deadline, start)
        for target in _targets(config, cls)
        for size in sizes
        for mesh in meshes.get(size, ((),))
    ]
    metafunc.parametrize(LANE, lanes, ids=[lane.id for lane in lanes], scope="class", indirect=True)


def _declared_meshes(cls: type[Suite]) -> dict[int, tuple[tuple[int, ...], ...]]:
    meshes = {size: tuple(map(tuple, shapes)) for size, shapes in cls.meshes.items()}
    for size, shapes in meshes.items():
        for shape in shapes:
            if math.prod(shape) != size or not shape or 0 in shape:
                raise pytest.UsageError(
                    f"{cls.__name__}.meshes: the mesh {shape} at world size {size} holds "
                    f"{math.prod(shape)} ranks; each mesh must hold the world size's ranks"
                )
    return meshes


def _lanes_of(items: list[pytest.Item]) -> list[tuple[pytest.Item, Lane]]:
    found = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        lane = callspec.params.get(LANE) if callspec is not None else None
        if isinstance(lane, Lane):
            found.append((item, lane))
    return found


def _require_lanes(lanes: list[Lane]) -> None:
    missing = {}
    for lane in lanes:
        reason = backend_unavailable(lane.backend, lane.world_size)
        if reason:
            missing[lane.id] = reason
    if missing:
        listed = "\n".join(f"  {lane}: {reason}" for lane, reason in sorted(missing.items()))
        raise pytest.UsageError(
            "--plait-require-lanes: these lanes cannot run on this machine:\n"
            f"{listed}\nrun the job where the lane's devices are, or choose other "
            "--plait-backend / --plait-world-sizes"
        )


def _for_another_run(entry: Expectation, lanes: list[Lane]) -> bool:
    """Whether the entry names a lane this run does not have (another job's entry)."""
    part = entry.lane_part()
    if part is None:
        return False
    return not any(Expectation(part, "", 0).matches(*lane.names) for lane in lanes)


# First: pytest-xdist's worker reads the group markers in its own hook of this name,
# which pluggy calls before ours otherwise (it is registered later).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Label the suite's tests, group each lane on one xdist worker, apply expectations."""
    options = options_of(config)
    expectations = options.expectations
    suite = _lanes_of(items)
    lanes = list(dict.fromkeys(lane for _, lane in suite))
    if options.require_lanes:
        _require_lanes(lanes)
    matched: set[int] = set()
    keys: list[str] = []
    for item, lane in suite:
        name = getattr(item, "originalname", item.name).removeprefix("test_")
        names = [f"{name}[{each}]" for each in lane.names]
        keys.append(names[-1])
        item.user_properties.append((LANE, lane.describe()))
        item.user_properties.append((PROPERTY, name))
        if options.xdist:
            item.add_marker(pytest.mark.xdist_group(lane.id))
        for index, entry in enumerate(expectations):
            if entry.matches(*names, item.nodeid):
                matched.add(index)
                item.add_marker(pytest.mark.xfail(reason=entry.reason, strict=True))
                break
    for index, entry in enumerate(expectations):
        if index in matched or _for_another_run(entry, lanes):
            continue  # an entry for lanes another run has is kept quiet
        close = difflib.get_close_matches(entry.pattern, keys, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        warnings.warn(
            ExpectationWarning(
                f"expectation {entry.pattern!r} (line {entry.line}) matched no test of the "
                f"lanes that ran: remove it, or fix the pattern{hint}"
            ),
            stacklevel=1,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A violation's one-line headline as the reason pytest's short summary shows."""
    report = yield
    # Looked up, not imported: a run without the suite never loads the properties.
    properties = sys.modules.get("plait.conformance.properties")
    excinfo = call.excinfo
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if properties is None or excinfo is None or not hasattr(crash, "message"):
        return report
    violation = excinfo.value
    if isinstance(violation, properties.ContractViolation):
        crash.message = f"ContractViolation: {violation.headline}"  # type: ignore[union-attr]
    return report


def pytest_pycollect_makemodule(
    module_path: Path, parent: pytest.Collector
) -> pytest.Module | None:
    """The shipped suite, run with ``--pyargs``, under its package path in test ids."""
    if module_path.resolve() != _SHIPPED_SUITE:
        return None
    return pytest.Module.from_parent(parent, path=module_path, nodeid="plait/conformance/suite.py")


@pytest.fixture(scope="session")
def plait_pools() -> Iterator[PoolCache]:
    """The session's rank pools, closed at its end."""
    cache = PoolCache()
    yield cache
    cache.close()


@pytest.fixture(scope="class")
def plait_lane(request: pytest.FixtureRequest) -> Lane:
    """The strategy, backend and world size of this group; skipped where it cannot run."""
    lane: Lane = request.param
    reason = backend_unavailable(lane.backend, lane.world_size)
    if reason:
        pytest.skip(f"{reason} (--plait-require-lanes makes this an error)")
    return lane


@pytest.fixture
def plait_pool(
    plait_lane: Lane, plait_pools: PoolCache, request: pytest.FixtureRequest
) -> RankPool:
    """The running pool of this group's lane (started by the lane's first test).

    Ranks that cannot start fail the lane's first test, with every rank's error;
    the lane's other tests are skipped, pointing to it.
    """
    failure = ""
    before = plait_pools.starts.get(plait_lane, 0)
    try:
        pool = plait_pools.get(plait_lane, request.node.name)
    except LaneDown as down:
        pytest.skip(str(down))
    except PoolStartError as error:
        failure = f"PoolStartError: {error}"
    else:
        if plait_pools.starts.get(plait_lane, 0) > before:
            # Counted by the controller: a lane split over pytest-xdist's workers
            # starts its ranks on each of them.
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            request.node.user_properties.append((STARTED, worker))
        return pool
    pytest.fail(failure, pytrace=False)  # the ranks' own tracebacks say where


@pytest.fixture(scope="session")
def plait_examples(request: pytest.FixtureRequest) -> int:
    """Drawn examples per property: ``--plait-examples``, or the profile's number."""
    return options_of(request.config).drawn_examples


@pytest.fixture(scope="session")
def plait_training_examples(request: pytest.FixtureRequest) -> int:
    """Drawn runs per training property: ``--plait-examples``, or the profile's number."""
    return options_of(request.config).training_examples


@pytest.fixture(scope="session")
def plait_seed(request: pytest.FixtureRequest) -> int:
    """The seed every property of this run draws its examples from."""
    return options_of(request.config).seed
