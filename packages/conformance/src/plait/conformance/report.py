"""The suite's reports: each property's outcome per lane, as JSON files and a summary.

A suite's test records what it proved on its item (`record`); the `Reporter`
(registered by the plugin, on the xdist controller where there is one) collects
every test's report, writes one JSON file per lane into ``--plait-report-dir`` and
prints a line per lane at the end of the run.
"""

from __future__ import annotations

import json
import platform
import statistics
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Final

import torch

from plait.conformance.lanes import UNHELD_DTYPES
from plait.conformance.options import options_of

if TYPE_CHECKING:
    import pytest

__all__ = [
    "COVERED",
    "EXAMPLES",
    "LANE",
    "OVER",
    "PROPERTY",
    "SECONDS",
    "STARTED",
    "VIOLATION",
    "Reporter",
    "record",
]

LANE: Final = "plait_lane"
"""The lane a test belongs to (`plait.conformance.plugin.Lane.describe`)."""
PROPERTY: Final = "plait_property"
"""The property a test proves."""
EXAMPLES: Final = "plait_examples"
"""How many examples it ran (to the failure, where one failed)."""
VIOLATION: Final = "plait_violation"
"""The violation it found, as plain data (`ContractViolation.describe`)."""
SECONDS: Final = "plait_seconds"
"""Seconds the proving took (a test's own time has its fixtures' besides)."""
OVER: Final = "plait_over"
"""On a mesh lane: what the property ran over (the job, and which dimensions)."""
COVERED: Final = "plait_covered"
"""What the examples that ran covered, in words (`ExampleKind.covered`), where a kind says."""
STARTED: Final = "plait_pool_started"
"""The xdist worker on which a test started its lane's ranks."""


def record(
    node: pytest.Item,
    *,
    examples: int | None,
    seconds: float,
    violation: dict[str, object] | None = None,
    over: str | None = None,
    covered: str | None = None,
) -> None:
    """Record on ``node`` what its test proved, for the `Reporter` (and JUnit reports)."""
    labels = node.user_properties
    labels.append((EXAMPLES, examples))
    if over is not None:
        labels.append((OVER, over))
    if covered is not None:
        labels.append((COVERED, covered))
    labels.append((SECONDS, seconds))
    if violation is not None:
        labels.append((VIOLATION, violation))


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
        lane = labels.get(LANE)
        if not isinstance(lane, dict) or (report.when != "call" and report.passed):
            return
        started = labels.get(STARTED)
        if report.when == "call" and isinstance(started, str):
            self.starts.setdefault(str(lane["id"]), []).append(started)
        outcome: str = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        violation = labels.get(VIOLATION)
        proving = labels.get(SECONDS)
        entry: dict[str, object] = {
            "outcome": outcome,
            "examples": labels.get(EXAMPLES),
            "seconds": round(report.duration, 3),
            "proving_seconds": round(proving, 3) if isinstance(proving, float) else None,
            "message": _message(report, violation),
        }
        over = labels.get(OVER)
        if isinstance(over, str):
            entry["over"] = over  # a mesh lane's: the job, and each dimension's groups
        covered = labels.get(COVERED)
        if isinstance(covered, str):
            entry["covered"] = covered
        if isinstance(violation, dict):
            entry["violation"] = violation
        lane_id = str(lane["id"])
        self.lanes[lane_id] = lane
        self.results.setdefault(lane_id, {})[str(labels[PROPERTY])] = entry

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write one JSON report per lane into ``--plait-report-dir``."""
        directory = options_of(self.config).report_dir
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
        seed = options_of(self.config).seed
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
            for name, entry in sorted(properties.items()):
                if "covered" in entry:
                    terminalreporter.write_line(f"  {name}: {entry['covered']}")
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
