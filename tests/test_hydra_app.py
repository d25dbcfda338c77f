"""A Hydra app relaunched by the ``ddp`` launcher: one run, one folder, every rank in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.processes import processes_mentioning

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


@pytest.mark.slow
def test_each_job_of_a_multirun_starts_its_own_ranks_with_its_overrides(tmp_path: Path) -> None:
    # The second job must not take the first job's place in the environment (its
    # ranks have ended with their job): without a job of its own it would wait for a
    # rank that never comes.
    command = [sys.executable, str(APP), "-m", "lr=0.5,0.75", "hydra.sweep.dir=sweep"]
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=110, check=False
    )

    assert not processes_mentioning(str(APP)), "a rank was left running"
    assert done.returncode == 0, done.stderr[-4000:]
    jobs = sorted(path for path in (tmp_path / "sweep").iterdir() if path.is_dir())
    assert [job.name for job in jobs] == ["0", "1"]
    for job, lr in zip(jobs, (0.5, 0.75), strict=True):
        ranks = [json.loads((job / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
        assert {rank["output_dir"] for rank in ranks} == {str(job)}
        assert [rank["lr"] for rank in ranks] == [lr, lr]
