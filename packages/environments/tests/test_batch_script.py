"""`batch_script`: SLURM batch scripts that run one task per device and requeue."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from plait.core import ConfigurationError
from plait.environments import batch_script, time_limit_seconds


def directives(script: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")
    ]


def test_the_script_asks_for_one_task_per_device_on_every_node_and_requeues() -> None:
    script = batch_script(
        ["python", "train.py", "--data", "/data/my set"],
        nodes=2,
        tasks_per_node=4,
        gpus_per_node=4,
        time="04:00:00",
        job_name="digits",
        partition="gpu",
        options=["--account=ml", "--mem=64G"],
    )

    assert script.startswith("#!/bin/bash\n")
    assert directives(script) == [
        "--job-name=digits",
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gres=gpu:4",
        "--partition=gpu",
        "--time=04:00:00",
        "--signal=USR1@120",
        "--requeue",
        "--open-mode=append",
        "--account=ml",
        "--mem=64G",
    ]
    assert "srun python train.py --data '/data/my set'\n" in script  # quoted for the shell


def test_without_gpus_time_or_signal_the_script_asks_for_none() -> None:
    script = batch_script(["train"], nodes=1, tasks_per_node=2, signal_before=None)

    assert directives(script) == [
        "--job-name=plait",
        "--nodes=1",
        "--ntasks-per-node=2",
        "--requeue",
        "--open-mode=append",
    ]


@pytest.mark.skipif(shutil.which("bash") is None, reason="runs the script with bash")
@pytest.mark.parametrize(
    ("status", "requeued"), [(0, False), (1, False), (138, True), (143, False)]
)
def test_the_script_requeues_the_job_only_when_the_ranks_stopped_on_sigusr1(
    tmp_path: Path, status: int, requeued: bool
) -> None:
    # srun and scontrol stand-ins that record what they were asked; the script is run
    # as sbatch runs it, by bash.
    for name, body in (
        ("srun", f'echo "srun $*" >>"$LOG"; exit {status}'),
        ("scontrol", 'echo "scontrol $*" >>"$LOG"'),
    ):
        tool = tmp_path / name
        tool.write_text(f"#!/bin/bash\n{body}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "job.sh"
    script.write_text(batch_script(["train", "--ckpt-path", "last"], nodes=1, tasks_per_node=2))
    log = tmp_path / "log"
    environment = {
        **os.environ,
        "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
        "LOG": str(log),
        "SLURM_JOB_ID": "4242",
    }

    ran = subprocess.run(
        ["bash", str(script)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert ran.returncode == status
    assert f"plait: the job step ended with exit status {status}" in ran.stdout
    calls = log.read_text().splitlines()
    assert calls[0] == "srun train --ckpt-path last"
    assert calls[1:] == (["scontrol requeue 4242"] if requeued else [])


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("30:15", 1815),
        ("04:00:00", 14400),
        ("1-12", 129600),
        ("1-0:30", 88200),
        ("2-01:02:03", 176523),
        (" 10 ", 600),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_every_form_of_slurm_time_limit_is_read(text: str, seconds: int | None) -> None:
    assert time_limit_seconds(text) == seconds


@pytest.mark.parametrize("text", ["1h", "", "1:2:3:4", "-1", "a-1", "1-", "1.5", "0", "0:00:00"])
def test_a_time_that_slurm_would_not_read_is_refused_with_its_forms(text: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        time_limit_seconds(text)

    assert repr(text) in str(raised.value)
    assert "04:00:00" in str(raised.value)


def _script(**changes: object) -> Callable[[], str]:
    settings: dict[str, object] = {"command": ["train"], "nodes": 1, "tasks_per_node": 2}
    settings.update(changes)

    def make() -> str:
        # The point is to pass what the signature refuses, as an untyped caller would.
        return batch_script(**settings)  # type: ignore[arg-type]

    return make


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_script(command=[]), "no command to run"),
        (_script(nodes=0), "nodes=0 is not a whole number of at least 1"),
        (_script(tasks_per_node=True), "tasks_per_node=True"),
        (_script(gpus_per_node=-1), "gpus_per_node=-1"),
        (_script(signal_before=0), "signal_before=0 is not a number of seconds from 1 to 65535"),
        (_script(signal_before=70000), "signal_before=70000"),
        (_script(signal_before="120"), "signal_before='120'"),
        (_script(time="00:02:00"), "signal_before=120 s is not shorter than the time limit"),
        (_script(time="4h"), "'4h' is not a SLURM time limit"),
        (_script(job_name="my job"), "job_name='my job' is empty or holds white space"),
        (_script(partition=""), "partition='' is empty"),
        (_script(options=["-A ml"]), "'-A ml' is not an sbatch option of one line"),
        (_script(options=["--mem=1G\nrm -rf /"]), "is not an sbatch option of one line"),
    ],
)
def test_bad_settings_are_refused_naming_the_value_and_a_fix(
    make: Callable[[], str], message: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        make()

    assert message in str(raised.value)
    assert raised.value.fix
