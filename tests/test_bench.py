"""tools/bench.py runs, prints its table and writes one JSON row per measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "bench.py"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.slow
def test_the_conformance_section_reports_a_rate_per_property(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"

    run = _bench("--quick", "--sections", "conformance", "--json", str(out))

    assert run.returncode == 0, run.stderr
    assert "== conformance" in run.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {row["name"] for row in rows} >= {"broadcast, world size 2", "mismatch, world size 2"}
    assert all(row["plait_median"] > 0 and row["ratio"] is None for row in rows)


def test_an_unknown_section_is_refused_with_the_choices() -> None:
    run = _bench("--sections", "imports,speed")

    assert run.returncode == 2
    assert "unknown sections ['speed']: choose from imports, collectives, conformance" in run.stderr
