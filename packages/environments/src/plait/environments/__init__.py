"""Cluster environments: where a process sits in the job.

Local, TorchElastic, SLURM, LSF, Kubeflow, MPI and XLA environments, each meeting
the `plait.core.ClusterEnvironment` protocol, made in one step from the scheduler's
variables, and `detect_environment`, which says which one applies and why.
`LightningEnvironment()` makes Lightning's default environment as Lightning code
does, with no arguments: a `LocalEnvironment` from this process's variables.
"""

from plait.environments.base import BaseEnvironment
from plait.environments.detection import (
    DETECTION_ORDER,
    ENVIRONMENT_VARIABLE,
    Detection,
    detect_environment,
)
from plait.environments.kubeflow import KubeflowEnvironment
from plait.environments.local import LocalEnvironment
from plait.environments.lsf import LSFEnvironment
from plait.environments.mpi import MPIEnvironment
from plait.environments.slurm import SLURMEnvironment, batch_script, time_limit_seconds
from plait.environments.torchelastic import TorchElasticEnvironment
from plait.environments.variables import expand_hostlist
from plait.environments.xla import XLAEnvironment


def LightningEnvironment() -> LocalEnvironment:  # noqa: N802 - Lightning's class name
    """Lightning's default environment, made as Lightning code makes it (no arguments).

    A `LocalEnvironment` read from this process's variables (`LocalEnvironment.from_environ`):
    ``Trainer(plugins=[LightningEnvironment()])`` runs on this machine, without
    reading any scheduler's variables, as in Lightning.

    Raises:
        ConfigurationError: A launcher's variable is set but malformed.
    """
    return LocalEnvironment.from_environ()


__all__ = [
    "DETECTION_ORDER",
    "ENVIRONMENT_VARIABLE",
    "BaseEnvironment",
    "Detection",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LightningEnvironment",
    "LocalEnvironment",
    "MPIEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "XLAEnvironment",
    "batch_script",
    "detect_environment",
    "expand_hostlist",
    "time_limit_seconds",
]
