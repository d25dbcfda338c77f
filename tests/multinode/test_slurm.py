"""Real sbatch/srun jobs of ``plait fit`` on SLURM clusters made on this machine.

The clusters are made by ``tools/slurm-cluster`` (Debian's Slurm, installed as root
if missing): munged, slurmctld and one slurmd per node, configured under a
temporary directory and stopped afterwards. One cluster has one node, where a job
stopped by SIGUSR1 is requeued and resumes; another has two nodes, each a slurmd in
a network namespace of its own, over which one job trains as one world. The job
scripts are written by ``plait sbatch``, as the multi-node guide shows.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import pytest
import torch
from tests.multinode.hosts import hosts, unavailable
from tests.reliability.jobs import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tools" / "slurm-cluster"
PLAIT = Path(sys.executable).with_name("plait")


def job_script(root: Path, epochs: int, nodes: int) -> str:
    """The batch script ``plait sbatch`` writes: two tasks a node, requeued on SIGUSR1."""
    made = subprocess.run(
        [str(PLAIT), "sbatch", "--example", "digits", "--strategy", "ddp", "--accelerator", "cpu",
         "--devices", "2", "--num-nodes", str(nodes), "--max-epochs", str(epochs),
         "--no-progress-bar", "--default-root-dir", str(root), "--job-name", "digits"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return made.stdout


ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"})
"""The states a job leaves only when it is requeued."""


@attrs.frozen
class Cluster:
    """A cluster that ``tools/slurm-cluster`` made under ``home``.

    SLURM's commands run through ``where`` (a command prefix: the controller's
    network namespace, for nodes made in namespaces).
    """

    home: Path
    where: tuple[str, ...] = ()

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.home / "slurm.conf"), "OMP_NUM_THREADS": "1"}

    def run(self, *command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.where, *command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=self.env,
            cwd=cwd,
        )

    def submit(self, folder: Path, epochs: int, nodes: int = 1) -> str:
        """``sbatch`` the job script for a run under ``folder``; its job id."""
        script = folder / "job.sh"
        script.write_text(job_script(folder / "run", epochs, nodes))
        submitted = self.run(
            "sbatch", "--parsable", f"--output={folder / 'out.txt'}", str(script), cwd=folder
        )
        assert submitted.returncode == 0, submitted.stderr
        return submitted.stdout.strip().split(";")[0]

    def fields(self, job: str, *names: str) -> list[str]:
        """The values of ``names`` in one ``scontrol show job``."""
        shown = self.run("scontrol", "show", "job", job)
        values = []
        for name in names:
            found = re.search(rf"\b{name}=(\S+)", shown.stdout)
            assert found is not None, shown.stdout + shown.stderr
            values.append(found.group(1))
        return values

    def field(self, job: str, name: str) -> str:
        [value] = self.fields(job, name)
        return value

    def wait(
        self,
        job: str,
        ready: Callable[[], bool],
        timeout: float,
        what: str,
        *,
        interval: float = 0.02,
        output: Path | None = None,
    ) -> None:
        """`wait_for` ``ready``, failing with the end of ``output`` and what the cluster
        says of ``job`` and its daemons."""
        try:
            wait_for(ready, timeout, what, interval=interval)
        except AssertionError as error:
            printed = ""
            if output is not None:
                tail = output.read_text(errors="replace")[-3000:] if output.exists() else "(none)"
                printed = f"--- the job's output\n{tail}\n"
            raise AssertionError(f"{error}\n{printed}{self.diagnosis(job)}") from None

    def wait_until_ended(self, job: str, timeout: float, what: str) -> str:
        """Wait for ``job`` to end; its final state.

        A job whose launch failed is held (pending for ever): that fails at once,
        as a timeout does, with what the cluster says of the job and its daemons.
        """

        def ended() -> bool:
            state, reason = self.fields(job, "JobState", "Reason")
            return state in ENDED or reason == "launch_failed_requeued_held"

        self.wait(job, ended, timeout, what, interval=0.5)
        state = self.field(job, "JobState")
        if state not in ENDED:
            raise AssertionError(f"{what}: the job was held\n{self.diagnosis(job)}")
        return state

    def diagnosis(self, job: str) -> str:
        """What the cluster says of ``job`` and its nodes, and the end of its daemons' logs."""
        parts = []
        for command in (["scontrol", "show", "job", job], ["sinfo", "--Node", "--long"]):
            shown = self.run(*command)
            parts.append(f"$ {' '.join(command)}\n{shown.stdout}{shown.stderr}")
        for log in sorted(self.home.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)


@contextlib.contextmanager
def cluster(home: Path, *nodes: str, where: Sequence[str] = ()) -> Iterator[Cluster]:
    """Make a cluster with ``tools/slurm-cluster up``; take it down afterwards."""
    made = subprocess.run(
        [str(CLUSTER), "up", str(home), *nodes],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        assert made.returncode == 0, made.stdout + made.stderr
        yield Cluster(home, tuple(where))
    finally:
        subprocess.run([str(CLUSTER), "down", str(home)], timeout=120, check=False)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster of one node made for these tests."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run SLURM's daemons")
    with cluster(tmp_path_factory.mktemp("slurm")) as made:
        yield made


def parameters(folder: Path) -> dict[str, torch.Tensor]:
    saved = torch.load(folder / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    state: dict[str, torch.Tensor] = saved["state_dict"]
    return state


def interrupt_once_saved(slurm: Cluster, folder: Path, job: str, command: list[str]) -> None:
    """Run ``command JOB`` as soon as the job under ``folder`` has saved its first checkpoint.

    Called on a thread of its own right after the job is submitted: a watch that
    began only once every job was submitted (each ``sbatch`` takes seconds on a
    loaded machine) found a job that had already finished its training.
    """
    saved = folder / "run" / "checkpoints" / "last.ckpt"
    what = f"the first epoch's checkpoint of job {job}"
    slurm.wait(job, saved.exists, 240, what, output=folder / "out.txt")
    interrupted = slurm.run(*command, job)
    assert interrupted.returncode == 0, interrupted.stderr


def requeued_and_resumed(slurm: Cluster, job: str, folder: Path, signal_name: str) -> str:
    """Check that ``job`` was stopped by ``signal_name``, requeued once, resumed and completed.

    Its output is returned.
    """
    state = slurm.wait_until_ended(job, 300, "the requeued job to end")
    output = (folder / "out.txt").read_text()
    assert state == "COMPLETED", output[-3000:]
    assert slurm.field(job, "Restarts") == "1"
    # Where the first run did not say it stopped, what SLURM's daemons logged says
    # why (signalled when, killed when).
    assert f"plait: training stopped on {signal_name}" in output, (
        output[-3000:] + "\n" + slurm.diagnosis(job)
    )
    assert output.count("UserWarning: ckpt_path='last'") == 1  # the second run resumed
    assert "trained digits with ddp on 2 process(es) (cpu) for 16 epoch(s)" in output
    return output


@pytest.mark.timeout(900)
def test_sbatch_runs_plait_fit_and_a_stopped_or_preempted_job_is_requeued_and_resumes(
    slurm: Cluster, tmp_path: Path
) -> None:
    # Three jobs at once on the node's six CPUs: one left alone, one stopped as SLURM
    # does before the time limit (--signal=USR1@SECONDS: the script requeues the job),
    # one pre-empted (PreemptMode=REQUEUE, or an operator's requeue: SIGTERM to every
    # process of the job, SIGKILL KillWait later (120 s here, 30 s by default), then
    # the job is requeued without the script's help).
    undisturbed, stopped, preempted = (tmp_path / name for name in ("calm", "stopped", "preempted"))
    interrupts = {
        stopped: ["scancel", "--signal=USR1"],
        preempted: ["scontrol", "requeue"],
        undisturbed: None,
    }
    jobs = {}
    with ThreadPoolExecutor(max_workers=2) as watchers:
        watched = []
        for folder, command in interrupts.items():
            folder.mkdir()
            # 16 epochs: the signal, sent once the first epoch's checkpoint exists,
            # must come while the job still trains, however slow the machine is.
            jobs[folder] = slurm.submit(folder, 16)
            if command is not None:
                watched.append(
                    watchers.submit(interrupt_once_saved, slurm, folder, jobs[folder], command)
                )
        for watch in watched:
            watch.result(timeout=300)

    state = slurm.wait_until_ended(jobs[undisturbed], 300, "the undisturbed job to end")
    output = (undisturbed / "out.txt").read_text()
    assert state == "COMPLETED", output[-3000:]
    assert "trained digits with ddp on 2 process(es) (cpu) for 16 epoch(s)" in output
    assert "plait: the job step ended with exit status 0" in output
    expected = parameters(undisturbed)

    output = requeued_and_resumed(slurm, jobs[stopped], stopped, "SIGUSR1")
    assert "plait: the job step ended with exit status 138" in output
    for name, value in parameters(stopped).items():
        assert torch.equal(value, expected[name]), name
    requeued_and_resumed(slurm, jobs[preempted], preempted, "SIGTERM")
    for name, value in parameters(preempted).items():
        assert torch.equal(value, expected[name]), name


@pytest.mark.timeout(600)
def test_sbatch_over_two_nodes_runs_plait_fit_as_one_world_of_four(tmp_path: Path) -> None:
    # Two slurmd, each in a network namespace of its own, with its own address and
    # host name: SLURM's nodes node0 and node1.
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with hosts(2) as two:
        nodes = [f"node{index}={host.namespace}@{host.address}" for index, host in enumerate(two)]
        controller = ["nsenter", f"--net=/run/netns/{two[0].namespace}"]
        with cluster(tmp_path / "cluster", *nodes, where=controller) as slurm:
            before = [host.bytes_received() for host in two]

            job = slurm.submit(tmp_path, 2, nodes=2)

            state = slurm.wait_until_ended(job, 300, "the two-node job to end")
            output = (tmp_path / "out.txt").read_text()
            assert state == "COMPLETED", output[-3000:]
            assert "trained digits with ddp on 4 process(es) (cpu) for 2 epoch(s)" in output
            received = [
                host.bytes_received() - start for host, start in zip(two, before, strict=True)
            ]
            assert min(received) > 100_000, received  # the gradients crossed between the nodes
