"""The environment of tasks started by SLURM (``srun``, ``sbatch``)."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import ClassVar, Final

import attrs
from typing_extensions import Self, override

from plait.core import ConfigurationError
from plait.environments.base import BaseEnvironment
from plait.environments.variables import expand_hostlist, job_port, read_int, require

__all__ = ["SLURMEnvironment", "batch_script", "time_limit_seconds"]

INTERACTIVE_JOB_NAMES: Final = frozenset({"bash", "interactive"})
"""Job names of interactive allocations, where plait starts the processes itself."""

STOPPED_BY_SIGUSR1: Final = 128 + 10
"""The exit status of a program stopped by SIGUSR1 (Linux numbers it 10): every rank
saved ``last.ckpt``, and the batch script requeues the job."""

_TIME_LIMIT_FORMATS: Final = (
    "MINUTES",
    "MINUTES:SECONDS",
    "HOURS:MINUTES:SECONDS",
    "DAYS-HOURS",
    "DAYS-HOURS:MINUTES",
    "DAYS-HOURS:MINUTES:SECONDS",
)


def _task_counts(text: str) -> list[int] | None:
    # SLURM_TASKS_PER_NODE reads like "4(x2),3": 4 tasks on each of two nodes, then 3.
    counts: list[int] = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts or None


@attrs.frozen(kw_only=True)
class SLURMEnvironment(BaseEnvironment):
    """Tasks started by SLURM, one process per device.

    Detected by ``SLURM_NTASKS``, unless the job is an interactive allocation
    (``SLURM_JOB_NAME`` is ``bash`` or ``interactive``), where plait starts the
    processes. The rendezvous is rank 0's host, the first of ``SLURM_NODELIST``
    (or ``MASTER_ADDR``), at ``MASTER_PORT`` or a port derived from the job id, which
    every task computes alike.

    Attributes:
        num_nodes: Nodes in the allocation (``SLURM_NNODES``).
        tasks_per_node: Tasks on this job's first node (``SLURM_TASKS_PER_NODE``), if
            known.
        task_counts: Tasks on each node, in order (``SLURM_TASKS_PER_NODE``), if known.
        job_id: ``SLURM_JOB_ID``.
    """

    name = "slurm"
    variables: ClassVar[Mapping[str, str]] = {
        "main_address": "SLURM_NODELIST",
        "main_port": "SLURM_JOB_ID",
        "world_size": "SLURM_NTASKS",
        "global_rank": "SLURM_PROCID",
        "local_rank": "SLURM_LOCALID",
        "node_rank": "SLURM_NODEID",
    }

    num_nodes: int
    tasks_per_node: int | None
    job_id: int
    task_counts: tuple[int, ...] | None = None

    @classmethod
    @override
    def matches(cls, environ: Mapping[str, str]) -> dict[str, str] | None:
        """``SLURM_NTASKS``, in a job that is not an interactive allocation."""
        if "SLURM_NTASKS" not in environ:
            return None
        job_name = environ.get("SLURM_JOB_NAME", "")
        if job_name in INTERACTIVE_JOB_NAMES:
            return None
        return {"SLURM_NTASKS": environ["SLURM_NTASKS"], "SLURM_JOB_NAME": job_name}

    @classmethod
    @override
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read SLURM's variables.

        Raises:
            ConfigurationError: One is missing or malformed.
        """
        environ = os.environ if environ is None else environ
        env = cls.name
        job_id = read_int(environ, "SLURM_JOB_ID", environment=env)
        if "MASTER_ADDR" in environ:
            address = environ["MASTER_ADDR"]
        else:
            nodelist = environ.get("SLURM_NODELIST") or require(
                environ, "SLURM_JOB_NODELIST", environment=env
            )
            address = expand_hostlist(nodelist)[0]
        nodes_variable = "SLURM_NNODES" if "SLURM_NNODES" in environ else "SLURM_JOB_NUM_NODES"
        counts = _task_counts(environ.get("SLURM_TASKS_PER_NODE", ""))
        return cls(
            main_address=address,
            main_port=job_port(environ, job_id, environment=env),
            world_size=read_int(environ, "SLURM_NTASKS", environment=env, minimum=1),
            global_rank=read_int(environ, "SLURM_PROCID", environment=env),
            local_rank=read_int(environ, "SLURM_LOCALID", environment=env),
            node_rank=read_int(environ, "SLURM_NODEID", environment=env),
            num_nodes=read_int(environ, nodes_variable, environment=env, minimum=1),
            tasks_per_node=counts[0] if counts else None,
            task_counts=tuple(counts) if counts else None,
            job_id=job_id,
        )

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check SLURM's nodes and tasks against ``num_nodes`` and ``devices``.

        Raises:
            ConfigurationError: They differ; the message gives the ``srun``/``sbatch``
                options or the settings that make them agree.
        """
        if self.num_nodes != num_nodes:
            raise ConfigurationError(
                f"SLURM allocated {self.num_nodes} node(s) (SLURM_NNODES), "
                f"but num_nodes={num_nodes}",
                value=self.num_nodes,
                fix=f"submit with --nodes={num_nodes}, or set num_nodes={self.num_nodes}",
            )
        if self.task_counts is not None and len(set(self.task_counts)) > 1:
            listed = ", ".join(str(count) for count in self.task_counts)
            raise ConfigurationError(
                f"SLURM started different numbers of tasks on its nodes ({listed}, from "
                "SLURM_TASKS_PER_NODE), but plait needs the same number on each: "
                f"devices={num_devices} per node",
                value=self.task_counts,
                fix=f"submit with --ntasks-per-node={num_devices} (and --ntasks="
                f"{num_devices * num_nodes}, or no --ntasks): --ntasks below --nodes x "
                "--ntasks-per-node leaves the last nodes short",
            )
        if self.tasks_per_node is not None and self.tasks_per_node != num_devices:
            raise ConfigurationError(
                f"SLURM started {self.tasks_per_node} task(s) per node "
                f"(SLURM_TASKS_PER_NODE), but devices={num_devices}: plait needs one task "
                "per device",
                value=self.tasks_per_node,
                fix=f"submit with --ntasks-per-node={num_devices}, set "
                f"devices={self.tasks_per_node}, or let plait start the processes from one "
                "task with PLAIT_CLUSTER_ENVIRONMENT=local",
            )
        super().validate_settings(num_devices, num_nodes)


def time_limit_seconds(text: str) -> int | None:
    """A SLURM time limit (``--time``) in seconds; ``None`` for ``UNLIMITED``.

    SLURM's forms: ``MINUTES``, ``MINUTES:SECONDS``, ``HOURS:MINUTES:SECONDS``,
    ``DAYS-HOURS``, ``DAYS-HOURS:MINUTES`` and ``DAYS-HOURS:MINUTES:SECONDS``.

    Raises:
        ConfigurationError: ``text`` is none of them, or is no time at all.
    """
    stripped = text.strip()
    if stripped.upper() in {"UNLIMITED", "INFINITE"}:
        return None
    days, clock = 0, stripped
    if "-" in stripped:
        day_text, clock = stripped.split("-", 1)
        days = int(day_text) if day_text.isdigit() else -1
    parts = clock.split(":")
    valid = days >= 0 and 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)
    if valid and "-" in stripped:
        hours, minutes, seconds = [*map(int, parts), 0, 0][:3]
    elif valid and len(parts) == 3:
        hours, minutes, seconds = map(int, parts)
    elif valid:
        hours, (minutes, seconds) = 0, [*map(int, parts), 0][:2]
    else:
        raise ConfigurationError(
            f"{text!r} is not a SLURM time limit",
            value=text,
            choices=_TIME_LIMIT_FORMATS,
            fix="write e.g. 04:00:00 for four hours, or 1-12 for a day and a half",
        )
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise ConfigurationError(
            f"the time limit {text!r} is no time at all",
            value=text,
            fix="give the job some time, e.g. 04:00:00, or leave the limit to the partition",
        )
    return total


def _option_value(name: str, value: str) -> str:
    if not value or any(character.isspace() for character in value):
        raise ConfigurationError(
            f"{name}={value!r} is empty or holds white space, which an #SBATCH line cannot",
            value=value,
            fix=f"give {name} as one word, without spaces",
        )
    return value


def batch_script(
    command: Sequence[str],
    *,
    nodes: int,
    tasks_per_node: int,
    gpus_per_node: int = 0,
    time: str | None = None,
    signal_before: int | None = 120,
    job_name: str = "plait",
    partition: str | None = None,
    options: Sequence[str] = (),
) -> str:
    """An ``sbatch`` script that runs ``command`` as one task per device, and requeues.

    ``srun`` starts ``nodes x tasks_per_node`` tasks, each a rank that
    `SLURMEnvironment` places. SLURM sends SIGUSR1 ``signal_before`` seconds before
    the time limit; plait's trainer stops every rank after the same batch, saves
    ``last.ckpt`` and exits with status 138, and the script then requeues the job,
    which runs ``command`` again: give it ``ckpt_path="last"`` (``--ckpt-path last``)
    to resume. A job that SLURM pre-empts is sent SIGTERM, saves alike, and is
    requeued by SLURM itself. Output is appended across requeues.

    Args:
        command: The program each task runs, e.g. ``["python", "train.py"]``.
        nodes: ``--nodes``: machines, as the trainer's ``num_nodes``.
        tasks_per_node: ``--ntasks-per-node``: processes per machine, one per device,
            as the trainer's ``devices``.
        gpus_per_node: GPUs to request on each node (``--gres=gpu:N``); 0 for none.
        time: ``--time``, the time limit, in any of SLURM's forms (e.g. ``04:00:00``);
            ``None`` leaves it to the partition.
        signal_before: Seconds before the time limit to send SIGUSR1
            (``--signal=USR1@N``); ``None`` sends none.
        job_name: ``--job-name``.
        partition: ``--partition``; ``None`` for the cluster's default.
        options: More ``sbatch`` options, one per ``#SBATCH`` line (e.g.
            ``"--account=ml"``, ``"--mem=64G"``).

    Raises:
        ConfigurationError: A count is below its minimum, the time limit is malformed
            or not longer than ``signal_before``, a name holds white space, an option
            does not start with ``--``, or ``command`` is empty.
    """
    if not command:
        raise ConfigurationError(
            "the batch script has no command to run",
            value=command,
            fix="pass the program each task runs, e.g. ['python', 'train.py']",
        )
    counts: tuple[tuple[str, object, int], ...] = (
        ("nodes", nodes, 1),
        ("tasks_per_node", tasks_per_node, 1),
        ("gpus_per_node", gpus_per_node, 0),
    )
    for name, value, minimum in counts:  # checked whatever a caller without types passes
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigurationError(
                f"{name}={value!r} is not a whole number of at least {minimum}",
                value=value,
                fix=f"pass {name} as an int >= {minimum}",
            )
    limit = None if time is None else time_limit_seconds(time)
    if signal_before is not None:
        given: object = signal_before  # checked whatever a caller without types passes
        if isinstance(given, bool) or not isinstance(given, int) or not 0 < given <= 65535:
            raise ConfigurationError(
                f"signal_before={signal_before!r} is not a number of seconds from 1 to 65535 "
                "(SLURM's range for --signal)",
                value=signal_before,
                fix="pass e.g. signal_before=120, or None to send no signal",
            )
        if limit is not None and signal_before >= limit:
            raise ConfigurationError(
                f"signal_before={signal_before} s is not shorter than the time limit "
                f"{time!r} ({limit} s): the job would be signalled as it starts",
                value=signal_before,
                fix="send the signal a few minutes before the limit, e.g. signal_before=120, "
                "or give the job more time",
            )
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={_option_value('job_name', job_name)}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={tasks_per_node}",
    ]
    if gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{gpus_per_node}")
    if partition is not None:
        lines.append(f"#SBATCH --partition={_option_value('partition', partition)}")
    if time is not None:
        lines.append(f"#SBATCH --time={time.strip()}")
    if signal_before is not None:
        lines.append(f"#SBATCH --signal=USR1@{signal_before}")
    lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    for option in options:
        if not option.startswith("--") or "\n" in option:
            raise ConfigurationError(
                f"{option!r} is not an sbatch option of one line",
                value=option,
                fix="write long options, e.g. '--account=ml' or '--mem=64G'",
            )
        lines.append(f"#SBATCH {option}")
    lines += [
        "",
        "# One task per device: srun starts every rank, on every node.",
        f"srun {shlex.join(command)}",
        "status=$?",
        'echo "plait: the job step ended with exit status $status"',
        f"# {STOPPED_BY_SIGUSR1} = 128 + SIGUSR1: every rank stopped after the same batch",
        "# and saved last.ckpt; the requeued job runs the command again, resuming from it.",
        f'if [ "$status" -eq {STOPPED_BY_SIGUSR1} ]; then',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"
