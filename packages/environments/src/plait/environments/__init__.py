"""Cluster environments: where a process sits in the job.

Local, TorchElastic, SLURM, LSF, Kubeflow, MPI and XLA environments, each meeting
the `plait.core.ClusterEnvironment` protocol, made in one step from the scheduler's
variables, and `detect_environment`, which says which one applies and why.
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

__all__ = [
    "DETECTION_ORDER",
    "ENVIRONMENT_VARIABLE",
    "BaseEnvironment",
    "Detection",
    "KubeflowEnvironment",
    "LSFEnvironment",
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
