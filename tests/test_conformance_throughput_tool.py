"""tools/conformance_throughput.py runs and reports every property per world size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "conformance_throughput.py"


@pytest.mark.slow
def test_the_throughput_tool_prints_and_writes_a_rate_per_property(tmp_path: Path) -> None:
    out = tmp_path / "rates.json"

    run = subprocess.run(
        [sys.executable, str(TOOL), "--world-sizes", "1,2", "--examples", "5", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert run.returncode == 0, run.stderr
    assert "examples per second, strategy 'ddp'" in run.stdout
    rates = json.loads(out.read_text())
    assert set(rates) == {"1", "2"}
    assert "mismatch" not in rates["1"]  # needs two ranks
    assert all(rate > 0 for rate in rates["2"].values())
