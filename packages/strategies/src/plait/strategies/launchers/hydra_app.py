"""A Hydra app run again for each rank: the ranks stay in the run's folder, as one job.

Hydra makes a folder per run (``outputs/DATE/TIME``) from the command line it is
given. The ``popen`` launcher runs the program again for every other rank; run as
it was, each rank would make a folder of its own (and, from a multirun's command
line, a sweep of its own). Started under Hydra, a rank is given this job's
overrides alone, pinned to this run's folder, under a job name of its own (so its
log file is not rank 0's) and without a second copy of the configuration.

Hydra is never imported here: it is looked for among the modules the program has
loaded already.
"""

from __future__ import annotations

import sys
from typing import Final

import attrs

__all__ = ["HydraRun", "current_hydra_run"]

# Hydra's command-line flags that take a value (the others stand alone).
_FLAGS_WITH_VALUES: Final = frozenset({
    "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
    "--experimental-rerun", "--package", "-p",
})  # fmt: skip
_MULTIRUN_FLAGS: Final = frozenset({"-m", "--multirun"})
# Overrides of Hydra's own that a rank's command sets itself, or that belong to a sweep.
_PINNED: Final = ("hydra.run.dir", "hydra.job.name", "hydra.output_subdir", "hydra.mode")


@attrs.frozen
class HydraRun:
    """The Hydra job this program runs, as a started rank must repeat it.

    Attributes:
        output_dir: The run's folder, every rank's.
        original_cwd: The folder the program was started in (Hydra may have moved).
        job_name: The job's name.
        overrides: This job's overrides, the user's and Hydra's own, as Hydra
            recorded them (one job's, in a multirun).
    """

    output_dir: str
    original_cwd: str
    job_name: str
    overrides: tuple[str, ...]

    def command(self, program: list[str], arguments: list[str], rank: int) -> list[str]:
        """The command line that runs this job as ``rank``.

        Args:
            program: How the program is run (``python script.py``, ``python -m pkg``).
            arguments: The program's arguments (``sys.argv[1:]``): Hydra's flags are
                kept (``--config-name``...), ``--multirun`` and the overrides are
                replaced by this job's.
            rank: The rank started, for its job name.
        """
        flags: list[str] = []
        given = iter(arguments)
        for argument in given:
            if argument in _MULTIRUN_FLAGS or not argument.startswith("-"):
                continue  # a sweep's flag, or an override (this job's are below)
            flags.append(argument)
            if argument in _FLAGS_WITH_VALUES:
                flags.append(next(given, ""))
        return [
            *program,
            *flags,
            *self.overrides,
            f"hydra.run.dir={self.output_dir}",
            f"hydra.job.name={self.job_name}_rank_{rank}",
            "hydra.output_subdir=null",
        ]


def current_hydra_run() -> HydraRun | None:
    """The Hydra job this program runs, or ``None`` outside a Hydra app."""
    module = sys.modules.get("hydra.core.hydra_config")
    config_class = getattr(module, "HydraConfig", None)
    initialized = getattr(config_class, "initialized", None)
    if config_class is None or not callable(initialized) or not initialized():
        return None
    config = config_class.get()
    hydra_overrides = [
        str(override)
        for override in config.overrides.hydra
        if str(override).startswith("hydra.") and not str(override).startswith(_PINNED)
        and not str(override).startswith("hydra.sweep")
    ]  # fmt: skip
    return HydraRun(
        output_dir=str(config.runtime.output_dir),
        original_cwd=str(config.runtime.cwd),
        job_name=str(config.job.name),
        overrides=(*(str(override) for override in config.overrides.task), *hydra_overrides),
    )
