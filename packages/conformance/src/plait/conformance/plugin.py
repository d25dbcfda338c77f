"""The pytest plugin: options, rank pools as fixtures, expectations and JSON reports.

Loaded through the ``pytest11`` entry point of ``plait-conformance``. It only acts
on subclasses of `plait.conformance.ConformanceSuite`; other tests are untouched.
"""

from __future__ import annotations

import fnmatch
import json
import platform
import warnings
from collections.abc import Iterator, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import pytest
import torch

from plait.conformance.pool import LANES, UNHELD_DTYPES, RankPool, backend_unavailable
from plait.conformance.target import StrategyTarget

if TYPE_CHECKING:
    from plait.conformance.suite import ConformanceSuite
    from plait.conformance.target import StrategyFactory

__all__ = ["PROFILES", "ExpectationWarning", "Lane", "PoolCache", "Reporter"]

PROFILES: Final = {"quick": 25, "thorough": 200}
"""Examples per property of each ``--plait-profile``."""

_LANE: Final = "plait_lane"
_PROPERTY: Final = "plait_property"
_EXAMPLES: Final = "plait_examples"


class ExpectationWarning(pytest.PytestWarning):
    """An entry of the expectations file matched no test."""


@attrs.frozen
class Lane:
    """One group of the suite's tests: a strategy, a backend and a world size."""

    target: StrategyTarget
    backend: str
    world_size: int
    deadline: float

    def describe(self) -> dict[str, object]:
        """The lane as plain data, for reports."""
        return {
            "id": self.id,
            "strategy": self.target.spec,
            "backend": self.backend,
            "world_size": self.world_size,
        }

    @property
    def id(self) -> str:
        """``strategy-backend-world_size``, as pytest shows the group."""
        return f"{self.target.name}-{self.backend}-{self.world_size}"


class PoolCache:
    """The live rank pools of a session: a few at a time, closed when evicted.

    Args:
        size: How many pools may be up at once; each holds ``world_size`` processes.
    """

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._pools: dict[Lane, RankPool] = {}

    def get(self, lane: Lane) -> RankPool:
        """The pool of ``lane``, started (an older one is closed to make room)."""
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
            )
        self._pools[lane] = pool  # most recently used last
        pool.start()
        return pool

    def close(self) -> None:
        """Close every pool."""
        while self._pools:
            self._pools.popitem()[1].close()


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
        help="lane: gloo (CPU), nccl (CUDA) or xla; default: each suite's own (gloo)",
    )  # fmt: skip
    group.addoption(
        "--plait-world-sizes", default=None, metavar="N,N,...",
        help="numbers of ranks to test at, e.g. 1,2,4; default: each suite's own",
    )  # fmt: skip
    group.addoption(
        "--plait-profile", choices=tuple(PROFILES), default="quick",
        help="examples per property: quick (25) or thorough (200)",
    )  # fmt: skip
    group.addoption(
        "--plait-examples", type=int, default=None, metavar="N",
        help="examples per property, overriding the profile",
    )  # fmt: skip
    group.addoption(
        "--plait-deadline", type=float, default=None, metavar="SECONDS",
        help="seconds an example may take before it counts as a hang (default 30)",
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
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(size < 1 for size in sizes):
        raise pytest.UsageError(
            f"--plait-world-sizes={text!r} must list positive numbers of ranks, e.g. 1,2,4"
        )
    return sizes


@attrs.frozen
class _Expectation:
    pattern: str
    reason: str
    line: int

    def matches(self, *names: str) -> bool:
        """Whether the pattern (``*`` and ``?`` wildcards, brackets literal) matches a name."""
        escaped = self.pattern.replace("[", "\0").replace("]", "[]]").replace("\0", "[[]")
        return any(fnmatch.fnmatchcase(name, escaped) for name in names)


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
_expectations_key = pytest.StashKey[list[_Expectation]]()


def pytest_configure(config: pytest.Config) -> None:
    """Check the options early and read the expectations file."""
    # Each lane's tests carry xdist's group marker so that one worker runs a lane;
    # without pytest-xdist the marker is unknown, and --strict-markers refuses it.
    config.addinivalue_line(
        "markers", "xdist_group(name): run these tests on one pytest-xdist worker"
    )
    option = config.getoption("--plait-world-sizes")
    config.stash[_sizes_key] = _world_sizes(option) if option else None
    examples = config.getoption("--plait-examples")
    if examples is not None and examples < 1:
        raise pytest.UsageError(f"--plait-examples={examples} must be 1 or more")
    deadline = config.getoption("--plait-deadline")
    if deadline is not None and not deadline > 0:
        raise pytest.UsageError(f"--plait-deadline={deadline} must be a positive number")
    for spec in config.getoption("--plait-strategy"):
        try:
            StrategyTarget.of(spec).factory()
        except Exception as error:  # noqa: PERF203 - the first bad one ends the run
            raise pytest.UsageError(f"--plait-strategy={spec}: {error}") from error
    path = config.getoption("--plait-expectations")
    config.stash[_expectations_key] = _read_expectations(path) if path else []
    config.pluginmanager.register(Reporter(config), "plait-conformance-reporter")


def _targets(config: pytest.Config, cls: type[ConformanceSuite]) -> list[StrategyTarget]:
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
    lanes = [
        Lane(target, backend, size, deadline) for target in _targets(config, cls) for size in sizes
    ]
    metafunc.parametrize(
        _LANE, lanes, ids=[lane.id for lane in lanes], scope="class", indirect=True
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Label the suite's tests, group each lane on one xdist worker, apply expectations."""
    expectations = config.stash[_expectations_key]
    matched: set[int] = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        lane = callspec.params.get(_LANE) if callspec is not None else None
        if not isinstance(lane, Lane):
            continue
        name = getattr(item, "originalname", item.name).removeprefix("test_")
        key = f"{name}[{lane.id}]"
        item.user_properties.append((_LANE, lane.describe()))
        item.user_properties.append((_PROPERTY, name))
        item.add_marker(pytest.mark.xdist_group(lane.id))
        for index, entry in enumerate(expectations):
            if entry.matches(key, item.nodeid):
                matched.add(index)
                item.add_marker(pytest.mark.xfail(reason=entry.reason, strict=True))
                break
    for index, entry in enumerate(expectations):
        if index not in matched:
            warnings.warn(
                ExpectationWarning(
                    f"expectation {entry.pattern!r} (line {entry.line}) matched no test: "
                    "remove it, or fix the pattern"
                ),
                stacklevel=1,
            )


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
        pytest.skip(reason)
    return lane


@pytest.fixture(scope="class")
def plait_pool(plait_lane: Lane, plait_pools: PoolCache) -> RankPool:
    """The running pool of this group's lane."""
    return plait_pools.get(plait_lane)


@pytest.fixture(scope="session")
def plait_examples(request: pytest.FixtureRequest) -> int:
    """Examples per property: ``--plait-examples``, or the profile's number."""
    examples: int | None = request.config.getoption("--plait-examples")
    return examples or PROFILES[request.config.getoption("--plait-profile")]


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

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Record the outcome of a property's test (its call, or a failed set-up)."""
        labels = _labels(report)
        lane = labels.get(_LANE)
        if not isinstance(lane, dict) or (report.when != "call" and report.passed):
            return
        outcome: str = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        message = report.longreprtext.strip()[-4000:] if report.failed or report.skipped else ""
        lane_id = str(lane["id"])
        self.lanes[lane_id] = lane
        self.results.setdefault(lane_id, {})[str(labels[_PROPERTY])] = {
            "outcome": outcome,
            "examples": labels.get(_EXAMPLES),
            "seconds": round(report.duration, 3),
            "message": message,
        }

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
                "passed": all(
                    entry["outcome"] in ("passed", "skipped", "xfailed")
                    for entry in properties.values()
                ),
                "properties": properties,
                "versions": versions,
            }
            name = "".join(char if char.isalnum() or char in "-_." else "_" for char in lane_id)
            text = json.dumps(report, indent=2) + "\n"
            (root / f"{name}.json").write_text(text, encoding="utf-8")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """One line per lane: how many properties held."""
        if not self.results:
            return
        terminalreporter.section("plait conformance")
        for lane_id, properties in sorted(self.results.items()):
            counts: dict[str, int] = {}
            for entry in properties.values():
                outcome = str(entry["outcome"])
                counts[outcome] = counts.get(outcome, 0) + 1
            summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))
            terminalreporter.write_line(f"{lane_id}: {summary}")
        backends = sorted({str(lane["backend"]) for lane in self.lanes.values()})
        for backend in backends:
            for dtype, reason in UNHELD_DTYPES.get(backend, {}).items():
                terminalreporter.write_line(f"{backend} lanes: no {dtype} examples: {reason}")
