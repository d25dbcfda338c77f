"""The pytest plugin: options, rank pools as fixtures, expectations and JSON reports.

Loaded through the ``pytest11`` entry point of ``plait-conformance``. It only acts
on subclasses of `plait.conformance.ConformanceSuite`; other tests are untouched.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import math
import os
import platform
import random
import statistics
import sys
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import pytest
import torch

from plait.conformance.mesh import mesh_text
from plait.conformance.pool import (
    LANES,
    UNHELD_DTYPES,
    PoolStartError,
    RankPool,
    backend_unavailable,
)
from plait.conformance.target import StrategyTarget

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

PROFILES: Final = {"quick": 25, "thorough": 200}
"""Examples per property of each ``--plait-profile``."""

TRAINING_PROFILES: Final = {"quick": 6, "thorough": 30}
"""Drawn runs per training property of each ``--plait-profile`` (each run trains a few
times: a hundred collectives, not one)."""

SEED_VARIABLE: Final = "PLAIT_CONFORMANCE_SEED"
"""Where a run's seed is kept, so that pytest-xdist's workers draw from the same one."""

_SHIPPED_SUITE: Final = Path(__file__).with_name("suite.py").resolve()
_LANE: Final = "plait_lane"
_PROPERTY: Final = "plait_property"
_EXAMPLES: Final = "plait_examples"
_VIOLATION: Final = "plait_violation"
_SECONDS: Final = "plait_seconds"
_OVER: Final = "plait_over"
_STARTED: Final = "plait_pool_started"


class ExpectationWarning(pytest.PytestWarning):
    """An entry of the expectations file matched no test of a lane that ran."""


class LaneDown(Exception):  # noqa: N818 - a skip's reason, not an error of its own
    """A lane's ranks could not start; its first test failed saying why."""


@attrs.frozen
class Lane:
    """One group of the suite's tests: a strategy, a backend, a world size and a mesh.

    With a mesh (the target's), the strategy is built on it and every property runs
    over the whole job and over each dimension's groups.
    """

    target: StrategyTarget
    backend: str
    world_size: int
    deadline: float
    start_timeout: float = 120.0

    def describe(self) -> dict[str, object]:
        """The lane as plain data, for reports."""
        return {
            "id": self.id,
            "strategy": self.target.spec,
            "backend": self.backend,
            "world_size": self.world_size,
            **({"mesh": list(self.target.mesh)} if self.target.mesh else {}),
        }

    @property
    def id(self) -> str:
        """``strategy-backend-world_size`` (``-mesh``, e.g. ``-2x2``), as pytest shows it."""
        return self._named(self.target.name)

    @property
    def names(self) -> tuple[str, ...]:
        """The lane's id, and the same with the strategy written as it was given."""
        given = self._named(self.target.spec)
        return (self.id,) if given == self.id else (self.id, given)

    def _named(self, strategy: str) -> str:
        mesh = f"-{mesh_text(self.target.mesh)}" if self.target.mesh else ""
        return f"{strategy}-{self.backend}-{self.world_size}{mesh}"


class PoolCache:
    """The live rank pools of a session: a few at a time, closed when evicted.

    Args:
        size: How many pools may be up at once; each holds ``world_size`` processes.
    """

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._pools: dict[Lane, RankPool] = {}
        self._failed: dict[Lane, str] = {}
        self.starts: dict[Lane, int] = {}
        """How many times each lane's ranks were started in this process."""
        self.failed: dict[Lane, list[str]] = {}
        """Per lane, the properties that failed on it so far, in order."""

    def get(self, lane: Lane, test: str = "") -> RankPool:
        """The pool of ``lane``, started (an older one is closed to make room).

        Raises:
            PoolStartError: The ranks could not start, the first time for the lane.
            LaneDown: They could not start before: the first error said why.
        """
        first = self._failed.get(lane)
        if first is not None:
            raise LaneDown(f"the ranks of {lane.id} could not start: see the error of {first}")
        pool = self._pools.pop(lane, None)
        if pool is None:
            while len(self._pools) >= self.size:
                oldest = next(iter(self._pools))
                self._pools.pop(oldest).close()
            pool = RankPool(
                lane.target,
                world_size=lane.world_size,
                backend=lane.backend,
                deadline=lane.deadline,
                start_timeout=lane.start_timeout,
                mesh=lane.target.mesh,
            )
        self._pools[lane] = pool  # most recently used last
        if not pool.running:
            self.starts[lane] = self.starts.get(lane, 0) + 1
        try:
            pool.start()
        except PoolStartError:
            self._pools.pop(lane).close()
            self._failed[lane] = test or lane.id
            raise
        return pool

    def close(self) -> None:
        """Close every pool."""
        while self._pools:
            self._pools.popitem()[1].close()


def _whole(least: int) -> Callable[[str], int]:
    """An option's parser: a whole number of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} must be {least} or more")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--plait-*`` options."""
    group = parser.getgroup("plait", "plait conformance suite")
    group.addoption(
        "--plait-strategy", action="append", default=[], metavar="SPEC",
        help="strategy for the suite: a registered name ('ddp'), 'package.module:factory' "
        "or 'path/file.py:factory'; repeat for several",
    )  # fmt: skip
    group.addoption(
        "--plait-backend", choices=tuple(LANES), default=None,
        help="lane: gloo (CPU), gloo-cuda (gloo with CUDA tensors, ranks sharing GPUs), "
        "nccl (CUDA) or xla; default: each suite's own (gloo)",
    )  # fmt: skip
    group.addoption(
        "--plait-world-sizes", default=None, metavar="N,N,...",
        help="numbers of ranks to test at, e.g. 1,2,3,4 (keep one that is not a power of "
        "two: 3 breaks what halves the ranks); default: each suite's own (1,2,3)",
    )  # fmt: skip
    group.addoption(
        "--plait-meshes", default=None, metavar="N:AxB,...",
        help="mesh lanes: at world size N, the strategy built on each mesh shape (its "
        "factory takes mesh_shape), every property over the job and over each dimension, "
        "e.g. 4:2x2,4:1x4,2:2x1; default: each suite's own (meshes)",
    )  # fmt: skip
    group.addoption(
        "--plait-profile", choices=tuple(PROFILES), default="quick",
        help="drawn examples per property, after the grid: quick (25) or thorough (200); "
        "runs per training property: quick (6) or thorough (30)",
    )  # fmt: skip
    group.addoption(
        "--plait-examples", type=_whole(1), default=None, metavar="N",
        help="drawn examples per property, overriding the profile",
    )  # fmt: skip
    group.addoption(
        "--plait-seed", type=_whole(0), default=None, metavar="N",
        help="draw the examples from seed N (default: a new seed each run, printed in "
        "the header and on every failure)",
    )  # fmt: skip
    group.addoption(
        "--plait-deadline", type=_seconds, default=None, metavar="SECONDS",
        help="seconds an example may take before it counts as a hang (default 30)",
    )  # fmt: skip
    group.addoption(
        "--plait-start-timeout", type=_seconds, default=None, metavar="SECONDS",
        help="seconds the ranks may take to build the strategy and join (default 120)",
    )  # fmt: skip
    group.addoption(
        "--plait-require-lanes", action="store_true", default=False,
        help="fail, instead of skipping, when a lane cannot run on this machine "
        "(no GPU for nccl, no torch_xla for xla): for CI jobs on accelerators",
    )  # fmt: skip
    group.addoption(
        "--plait-report-dir", default=None, metavar="DIR",
        help="write a JSON report per strategy x backend x world size into DIR",
    )  # fmt: skip
    group.addoption(
        "--plait-expectations", default=None, metavar="FILE",
        help="known failures: lines of 'PATTERN  # reason', PATTERN matching "
        "'property[strategy-backend-world_size]'",
    )  # fmt: skip


def _world_sizes(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",")]
    sizes: tuple[int, ...] = ()
    if all(part.isdigit() for part in parts):
        sizes = tuple(int(part) for part in parts)
    if not sizes or any(size < 1 for size in sizes):
        raise pytest.UsageError(
            f"--plait-world-sizes={text!r} must list positive numbers of ranks, separated "
            "by commas, e.g. 1,2,3,4"
        )
    return tuple(dict.fromkeys(sizes))


def _meshes(text: str) -> dict[int, tuple[tuple[int, ...], ...]]:
    found: dict[int, tuple[tuple[int, ...], ...]] = {}
    for part in (part.strip() for part in text.split(",")):
        size, colon, shape = part.partition(":")
        sizes = shape.split("x")
        if not (colon and size.isdigit() and all(each.isdigit() for each in sizes)):
            raise pytest.UsageError(
                f"--plait-meshes={text!r}: {part!r} is not WORLD_SIZE:AxB; write e.g. "
                "4:2x2,4:1x4,2:2x1"
            )
        mesh = tuple(int(each) for each in sizes)
        if math.prod(mesh) != int(size) or 0 in mesh:
            raise pytest.UsageError(
                f"--plait-meshes={text!r}: the mesh {shape} holds {math.prod(mesh)} ranks, "
                f"not {size}"
            )
        found[int(size)] = (*found.get(int(size), ()), mesh)
    return found


@attrs.frozen
class _Expectation:
    pattern: str
    reason: str
    line: int

    def matches(self, *names: str) -> bool:
        """Whether the pattern (``*`` and ``?`` wildcards, brackets literal) matches a name."""
        escaped = self.pattern.replace("[", "\0").replace("]", "[]]").replace("\0", "[[]")
        return any(fnmatch.fnmatchcase(name, escaped) for name in names)

    def lane_part(self) -> str | None:
        """The part in brackets, ``strategy-backend-world_size``, if the pattern has one."""
        _, bracket, rest = self.pattern.partition("[")
        return rest.removesuffix("]") if bracket and rest.endswith("]") else None


def _read_expectations(path: str) -> list[_Expectation]:
    file = Path(path)
    if not file.is_file():
        raise pytest.UsageError(f"--plait-expectations={path!r}: no such file")
    entries = []
    for number, raw in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        pattern, _, reason = text.partition("#")
        if not reason.strip():
            raise pytest.UsageError(
                f"{path}:{number}: {pattern.strip()!r} gives no reason; write "
                f"'PATTERN  # why it fails'"
            )
        entries.append(_Expectation(pattern.strip(), reason.strip(), number))
    return entries


_sizes_key = pytest.StashKey[tuple[int, ...] | None]()
_meshes_key = pytest.StashKey[dict[int, tuple[tuple[int, ...], ...]] | None]()
_expectations_key = pytest.StashKey[list[_Expectation]]()
_seed_key = pytest.StashKey[int]()
_xdist_key = pytest.StashKey[bool]()


def _choose_seed(config: pytest.Config) -> int:
    given: int | None = config.getoption("--plait-seed")
    if given is not None:
        return given
    inherited = os.environ.get(SEED_VARIABLE, "")
    if inherited.isdigit():  # a pytest-xdist worker: the controller's seed
        return int(inherited)
    hypothesis_seed = config.getoption("--hypothesis-seed", default=None)
    if isinstance(hypothesis_seed, int) or (
        isinstance(hypothesis_seed, str) and hypothesis_seed.isdigit()
    ):
        return int(hypothesis_seed)
    return random.SystemRandom().randrange(2**32)


def pytest_configure(config: pytest.Config) -> None:
    """Check the options early, choose the seed and read the expectations file."""
    # Each lane's tests carry xdist's group marker so that one worker runs a lane;
    # the marker means nothing without pytest-xdist, which then does not see it.
    xdist = config.pluginmanager.hasplugin("xdist")
    config.stash[_xdist_key] = xdist
    if xdist:
        config.addinivalue_line(
            "markers", "xdist_group(name): run these tests on one pytest-xdist worker"
        )
    option = config.getoption("--plait-world-sizes")
    config.stash[_sizes_key] = _world_sizes(option) if option else None
    meshes = config.getoption("--plait-meshes")
    config.stash[_meshes_key] = _meshes(meshes) if meshes else None
    seed = _choose_seed(config)
    config.stash[_seed_key] = seed
    os.environ[SEED_VARIABLE] = str(seed)  # inherited by pytest-xdist's workers
    for spec in config.getoption("--plait-strategy"):
        try:
            StrategyTarget.of(spec).factory()
        except Exception as error:  # noqa: PERF203 - the first bad one ends the run
            raise pytest.UsageError(f"--plait-strategy={spec}: {error}") from error
    path = config.getoption("--plait-expectations")
    config.stash[_expectations_key] = _read_expectations(path) if path else []
    config.pluginmanager.register(Reporter(config), "plait-conformance-reporter")


def pytest_report_header(config: pytest.Config) -> str:
    """The seed of this run, and how to draw the same examples again."""
    seed = config.stash[_seed_key]
    return f"plait conformance: seed {seed} (--plait-seed={seed} draws the same examples)"


def _targets(config: pytest.Config, cls: type[Suite]) -> list[StrategyTarget]:
    given: Sequence[str | StrategyFactory] = cls.strategies or config.getoption("--plait-strategy")
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
    if cls is None or not suite or _LANE not in metafunc.fixturenames:
        return
    config = metafunc.config
    backend = config.getoption("--plait-backend") or cls.backend
    sizes = config.stash[_sizes_key] or tuple(cls.world_sizes)
    deadline = config.getoption("--plait-deadline") or cls.deadline
    start = config.getoption("--plait-start-timeout") or cls.start_timeout
    declared = config.stash[_meshes_key]
    meshes = declared if declared is not None else _declared_meshes(cls)
    lanes = [
        Lane(attrs.evolve(target, mesh=mesh), backend, size, deadline, start)
        for target in _targets(config, cls)
        for size in sizes
        for mesh in meshes.get(size, ((),))
    ]
    metafunc.parametrize(
        _LANE, lanes, ids=[lane.id for lane in lanes], scope="class", indirect=True
    )


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
        lane = callspec.params.get(_LANE) if callspec is not None else None
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


def _for_another_run(entry: _Expectation, lanes: list[Lane]) -> bool:
    """Whether the entry names a lane this run does not have (another job's entry)."""
    part = entry.lane_part()
    if part is None:
        return False
    return not any(_Expectation(part, "", 0).matches(*lane.names) for lane in lanes)


# First: pytest-xdist's worker reads the group markers in its own hook of this name,
# which pluggy calls before ours otherwise (it is registered later).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Label the suite's tests, group each lane on one xdist worker, apply expectations."""
    expectations = config.stash[_expectations_key]
    suite = _lanes_of(items)
    lanes = list(dict.fromkeys(lane for _, lane in suite))
    if config.getoption("--plait-require-lanes"):
        _require_lanes(lanes)
    matched: set[int] = set()
    keys: list[str] = []
    for item, lane in suite:
        name = getattr(item, "originalname", item.name).removeprefix("test_")
        names = [f"{name}[{each}]" for each in lane.names]
        keys.append(names[-1])
        item.user_properties.append((_LANE, lane.describe()))
        item.user_properties.append((_PROPERTY, name))
        if config.stash[_xdist_key]:
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
            request.node.user_properties.append((_STARTED, worker))
        return pool
    pytest.fail(failure, pytrace=False)  # the ranks' own tracebacks say where


@pytest.fixture(scope="session")
def plait_examples(request: pytest.FixtureRequest) -> int:
    """Drawn examples per property: ``--plait-examples``, or the profile's number."""
    examples: int | None = request.config.getoption("--plait-examples")
    return examples or PROFILES[request.config.getoption("--plait-profile")]


@pytest.fixture(scope="session")
def plait_training_examples(request: pytest.FixtureRequest) -> int:
    """Drawn runs per training property: ``--plait-examples``, or the profile's number."""
    examples: int | None = request.config.getoption("--plait-examples")
    return examples or TRAINING_PROFILES[request.config.getoption("--plait-profile")]


@pytest.fixture(scope="session")
def plait_seed(request: pytest.FixtureRequest) -> int:
    """The seed every property of this run draws its examples from."""
    return request.config.stash[_seed_key]


def _labels(report: pytest.TestReport) -> dict[str, object]:
    return {str(key): value for key, value in report.user_properties}


class Reporter:
    """Collects each property's outcome per lane; writes the reports and the summary.

    Registered by `pytest_configure`; under xdist it runs on the controller, which
    receives every worker's reports.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.lanes: dict[str, dict[str, object]] = {}
        self.results: dict[str, dict[str, dict[str, object]]] = {}
        self.starts: dict[str, list[str]] = {}
        """Per lane, the worker of each start of its ranks."""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Record the outcome of a property's test (its call, or a failed set-up)."""
        labels = _labels(report)
        lane = labels.get(_LANE)
        if not isinstance(lane, dict) or (report.when != "call" and report.passed):
            return
        started = labels.get(_STARTED)
        if report.when == "call" and isinstance(started, str):
            self.starts.setdefault(str(lane["id"]), []).append(started)
        outcome: str = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        violation = labels.get(_VIOLATION)
        proving = labels.get(_SECONDS)
        entry: dict[str, object] = {
            "outcome": outcome,
            "examples": labels.get(_EXAMPLES),
            "seconds": round(report.duration, 3),
            "proving_seconds": round(proving, 3) if isinstance(proving, float) else None,
            "message": _message(report, violation),
        }
        over = labels.get(_OVER)
        if isinstance(over, str):
            entry["over"] = over  # a mesh lane's: the job, and each dimension's groups
        if isinstance(violation, dict):
            entry["violation"] = violation
        lane_id = str(lane["id"])
        self.lanes[lane_id] = lane
        self.results.setdefault(lane_id, {})[str(labels[_PROPERTY])] = entry

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write one JSON report per lane into ``--plait-report-dir``."""
        directory = self.config.getoption("--plait-report-dir")
        if not directory or hasattr(self.config, "workerinput"):
            return
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        versions = {
            "plait-conformance": version("plait-conformance"),
            "torch": torch.__version__,
            "python": platform.python_version(),
        }
        for lane_id, properties in sorted(self.results.items()):
            lane = self.lanes[lane_id]
            report = {
                "strategy": lane["strategy"],
                "backend": lane["backend"],
                "world_size": lane["world_size"],
                **({"mesh": lane["mesh"]} if "mesh" in lane else {}),
                "passed": all(
                    entry["outcome"] in ("passed", "skipped", "xfailed")
                    for entry in properties.values()
                ),
                "pool_starts": len(self.starts.get(lane_id, [])),
                "properties": properties,
                "versions": versions,
            }
            name = "".join(char if char.isalnum() or char in "-_." else "_" for char in lane_id)
            text = json.dumps(report, indent=2) + "\n"
            (root / f"{name}.json").write_text(text, encoding="utf-8")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """One line per lane: how many properties held, and how many examples a second ran."""
        if not self.results:
            return
        terminalreporter.section("plait conformance")
        seed = self.config.stash[_seed_key]
        for lane_id, properties in sorted(self.results.items()):
            counts: dict[str, int] = {}
            examples = 0
            rates = []
            for entry in properties.values():
                outcome = str(entry["outcome"])
                counts[outcome] = counts.get(outcome, 0) + 1
                ran, took = entry["examples"], entry["proving_seconds"]
                if isinstance(ran, int) and isinstance(took, float) and ran:
                    examples += ran
                    rates.append(ran / took if took > 0 else float("inf"))
            summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))
            if rates:
                summary += (
                    f"; {examples} examples, {statistics.median(rates):.0f} examples/s "
                    "(median over the properties)"
                )
            terminalreporter.write_line(f"{lane_id}: {summary}; {self._started(lane_id)}")
            for line in _failures(properties):
                terminalreporter.write_line(f"  {line}")
        terminalreporter.write_line(f"seed {seed}: --plait-seed={seed} draws the same examples")
        backends = sorted({str(lane["backend"]) for lane in self.lanes.values()})
        for backend in backends:
            for dtype, reason in UNHELD_DTYPES.get(backend, {}).items():
                terminalreporter.write_line(f"{backend} lanes: no {dtype} examples: {reason}")

    def _started(self, lane_id: str) -> str:
        """How often the lane's ranks started, and on which workers if more than once."""
        workers = self.starts.get(lane_id, [])
        if len(workers) <= 1:
            return "ranks started once" if workers else "ranks not started"
        if len(set(workers)) == 1:
            return (
                f"ranks started {len(workers)} times on {workers[0]}: its tests ran between "
                "other lanes' (a session keeps two lanes' ranks at a time)"
            )
        return (
            f"ranks started {len(workers)} times, on {', '.join(sorted(set(workers)))}: the "
            "lane was split over pytest-xdist's workers; run with --dist loadgroup, under a "
            "pytest it groups with (pytest-xdist issue 1386: under pytest 9.2 it groups nothing)"
        )


def _failures(properties: dict[str, dict[str, object]]) -> list[str]:
    """A lane's failed properties, one line each: the causes first, then their consequences."""
    causes, consequences = [], []
    for name, entry in properties.items():
        if entry["outcome"] != "failed":
            continue
        violation = entry.get("violation")
        if not isinstance(violation, dict):
            message = str(entry["message"]).splitlines()
            causes.append(f"{name}: {message[0] if message else 'failed'}")
            continue
        problems = violation.get("problems")
        first = str(problems[0]).splitlines()[0] if isinstance(problems, list) and problems else ""
        roots = violation.get("consequence_of")
        if isinstance(roots, list) and roots:
            consequences.append(f"{name}: a likely consequence of {' and '.join(roots)}: {first}")
        else:
            causes.append(f"{name}: {first}")
    return [*(f"FAILED {line}" for line in causes), *(f"after it {line}" for line in consequences)]


def _message(report: pytest.TestReport, violation: object) -> str:
    """A report's message: the violation, the reason for a skip, or the error itself."""
    if isinstance(violation, dict):
        problems = violation.get("problems")
        if isinstance(problems, list):
            return "\n".join(str(problem) for problem in problems)
    if not (report.failed or report.skipped):
        return ""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple | list) and len(longrepr) == len(("path", "line", "reason")):
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = getattr(crash, "message", None)
    if isinstance(text, str) and text:
        return text
    return report.longreprtext.strip()
