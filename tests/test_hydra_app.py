"""A Hydra app relaunched by the ``ddp`` launcher: one run, one folder, every rank in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.reliability.jobs import processes_mentioning

APP = Path(__file__).resolve().with_name("hydra_app.py")


@pytest.mark.slow
def test_every_rank_of_a_hydra_run_works_in_its_folder_with_its_overrides(tmp_path: Path) -> None:
    # A folder named to the microsecond: a rank that composed its own run would make
    # another one.
    command = [sys.executable, str(APP), "lr=0.25", "hydra.run.dir=runs/${now:%H-%M-%S-%f}"]
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=150, check=False
    )

    assert not processes_mentioning(str(APP)), "a rank was left running"
    assert done.returncode == 0, done.stderr[-4000:]
    [run] = list((tmp_path / "runs").iterdir())  # one folder for the whole job
    ranks = [json.loads((run / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert {rank["output_dir"] for rank in ranks} == {str(run)}
    assert [rank["lr"] for rank in ranks] == [0.25, 0.25]
    assert [rank["job"] for rank in ranks] == ["hydra_app", "hydra_app_rank_1"]
    # Rank 0 alone wrote the configuration Hydra keeps beside the run; each rank its log.
    assert sorted(path.name for path in run.iterdir()) == [
        ".hydra",
        "hydra_app.log",
        "hydra_app_rank_1.log",
        "rank-0.json",
        "rank-1.json",
    ]
