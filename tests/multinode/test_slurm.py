"""Real sbatch/srun jobs of ``plait fit`` on a one-machine SLURM cluster, and requeueing.

The cluster is made by ``tools/slurm-cluster`` (Debian's Slurm, installed as root if
missing): munged, slurmctld and one slurmd, configured under a temporary directory
and stopped afterwards. The job script is the one the multi-node guide gives.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.reliability.jobs import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tools" / "slurm-cluster"
PLAIT = Path(sys.executable).with_name("plait")


def job_script(root: Path, epochs: int) -> str:
    """A batch script of two tasks that requeues itself when stopped by SIGUSR1."""
    return f"""#!/bin/bash
#SBATCH --job-name=digits
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --requeue
#SBATCH --open-mode=append

srun {PLAIT} fit --example digits --strategy ddp --accelerator cpu --devices 2 \\
    --max-epochs {epochs} --no-progress-bar --default-root-dir {root} --ckpt-path last
status=$?
echo "exit status $status"
if [ "$status" -eq 138 ]; then
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The variables that point SLURM's commands at a cluster made for these tests."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run SLURM's daemons")
    home = tmp_path_factory.mktemp("slurm")
    made = subprocess.run(
        [str(CLUSTER), "up", str(home)], capture_output=True, text=True, timeout=300, check=False
    )
    try:
        assert made.returncode == 0, made.stdout + made.stderr
        yield {**os.environ, "SLURM_CONF": str(home / "slurm.conf"), "OMP_NUM_THREADS": "1"}
    finally:
        subprocess.run([str(CLUSTER), "down", str(home)], timeout=60, check=False)


def submit(
    slurm: dict[str, str], folder: Path, epochs: int, *options: str
) -> subprocess.CompletedProcess[str]:
    script = folder / "job.sh"
    script.write_text(job_script(folder / "run", epochs))
    return subprocess.run(
        ["sbatch", *options, f"--output={folder / 'out.txt'}", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=slurm,
        cwd=folder,
    )


def job_field(slurm: dict[str, str], job: str, field: str) -> str:
    shown = subprocess.run(
        ["scontrol", "show", "job", job],
        capture_output=True,
        text=True,
        timeout=30,
        env=slurm,
        check=True,
    )
    found = re.search(rf"\b{field}=(\S+)", shown.stdout)
    assert found is not None, shown.stdout
    return found.group(1)


def parameters(folder: Path) -> dict[str, torch.Tensor]:
    saved = torch.load(folder / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    state: dict[str, torch.Tensor] = saved["state_dict"]
    return state


@pytest.mark.timeout(900)
def test_sbatch_runs_plait_fit_and_a_job_stopped_by_sigusr1_is_requeued_and_resumes(
    slurm: dict[str, str], tmp_path: Path
) -> None:
    undisturbed, stopped = tmp_path / "undisturbed", tmp_path / "stopped"
    undisturbed.mkdir()
    stopped.mkdir()

    calm = submit(slurm, undisturbed, 8, "--wait")

    output = (undisturbed / "out.txt").read_text()
    assert calm.returncode == 0, calm.stderr + output[-3000:]
    assert "trained digits with ddp on 2 process(es) (cpu) for 8 epoch(s)" in output
    assert "exit status 0" in output

    submitted = submit(slurm, stopped, 8, "--parsable")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    checkpoint = stopped / "run" / "checkpoints" / "last.ckpt"
    wait_for(checkpoint.exists, 240, "the first epoch's checkpoint")
    # As SLURM does before the time limit with --signal=USR1@SECONDS.
    subprocess.run(["scancel", "--signal=USR1", job], env=slurm, timeout=30, check=True)

    wait_for(
        lambda: job_field(slurm, job, "JobState") == "COMPLETED", 300, "the requeued job to end"
    )
    assert job_field(slurm, job, "Restarts") == "1"
    output = (stopped / "out.txt").read_text()
    assert "plait: training stopped on SIGUSR1" in output
    assert "exit status 138" in output
    assert output.count("UserWarning: ckpt_path='last'") == 1  # the second run resumed
    assert "trained digits with ddp on 2 process(es) (cpu) for 8 epoch(s)" in output
    expected = parameters(undisturbed)
    for name, value in parameters(stopped).items():
        assert torch.equal(value, expected[name]), name
