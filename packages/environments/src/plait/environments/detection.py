"""Finding out which cluster environment this process runs in, and why."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import attrs

from plait.core import ClusterEnvironment, EnvironmentRegistry
from plait.environments.kubeflow import KubeflowEnvironment
from plait.environments.local import LocalEnvironment
from plait.environments.lsf import LSFEnvironment
from plait.environments.mpi import MPIEnvironment
from plait.environments.slurm import INTERACTIVE_JOB_NAMES, SLURMEnvironment
from plait.environments.torchelastic import TorchElasticEnvironment
from plait.environments.xla import XLAEnvironment

if TYPE_CHECKING:
    from plait.environments.base import BaseEnvironment

__all__ = ["DETECTION_ORDER", "ENVIRONMENT_VARIABLE", "Detection", "detect_environment"]

ENVIRONMENT_VARIABLE: Final = "PLAIT_CLUSTER_ENVIRONMENT"
"""Names the environment to use instead of detecting one, e.g. ``local``."""

DETECTION_ORDER: Final[tuple[type[BaseEnvironment], ...]] = (
    TorchElasticEnvironment,
    SLURMEnvironment,
    LSFEnvironment,
    KubeflowEnvironment,
    MPIEnvironment,
    XLAEnvironment,
)
"""The environments tried, in order; the local one when none matches.

torchrun comes first: its variables exist only in the processes it started, so they
are the truth even inside a SLURM or LSF allocation.
"""

_ALL: Final[tuple[type[BaseEnvironment], ...]] = (*DETECTION_ORDER, LocalEnvironment)
_BUILT_IN: Final = {environment.name: environment for environment in _ALL}


@attrs.frozen
class Detection:
    """The environment found, and why it was chosen.

    Attributes:
        environment: The environment, read from the variables.
        variables: The variables that decided it (empty for the local fallback).
        reason: One sentence for the log.
    """

    environment: ClusterEnvironment
    variables: Mapping[str, str]
    reason: str


def detect_environment(
    name: str | None = None, *, environ: Mapping[str, str] | None = None
) -> Detection:
    """Choose the cluster environment of this process.

    Args:
        name: Use this environment instead of detecting one: a built-in name
            (``local``, ``torchelastic``, ``slurm``, ``lsf``, ``kubeflow``, ``mpi``,
            ``xla``) or one registered in `EnvironmentRegistry`.
            ``PLAIT_CLUSTER_ENVIRONMENT`` does the same from outside the program.
        environ: The variables to read; the process's own by default.

    Raises:
        ConfigurationError: The name is unknown, or the chosen environment's
            variables are missing or malformed.
    """
    environ = os.environ if environ is None else environ
    chosen = name if name is not None else environ.get(ENVIRONMENT_VARIABLE)
    if chosen is not None:
        key = chosen.strip().lower()
        built_in = _BUILT_IN.get(key)
        environment: ClusterEnvironment = (
            built_in.from_environ(environ) if built_in is not None else EnvironmentRegistry.get(key)
        )
        if name is not None:
            return Detection(environment, {}, f"cluster environment {key!r} chosen by name")
        return Detection(
            environment,
            {ENVIRONMENT_VARIABLE: chosen},
            f"cluster environment {key!r} chosen by {ENVIRONMENT_VARIABLE}={chosen}",
        )
    for candidate in DETECTION_ORDER:
        variables = candidate.matches(environ)
        if variables is not None:
            shown = ", ".join(f"{key}={value}" for key, value in variables.items())
            return Detection(
                candidate.from_environ(environ),
                variables,
                f"cluster environment {candidate.name!r} detected from {shown}",
            )
    reason = "no scheduler's variables found: plait starts the processes on this machine"
    job_name = environ.get("SLURM_JOB_NAME")
    if "SLURM_NTASKS" in environ and job_name in INTERACTIVE_JOB_NAMES:
        reason = (
            f"an interactive SLURM allocation (SLURM_JOB_NAME={job_name}): "
            "plait starts the processes on this machine"
        )
    return Detection(LocalEnvironment.from_environ(environ), {}, reason)
