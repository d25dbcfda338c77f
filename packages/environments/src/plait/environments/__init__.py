"""Cluster environments: where a process sits in the job.

Local, TorchElastic, SLURM, LSF, Kubeflow, MPI and XLA environments, each meeting
the `plait.core.ClusterEnvironment` protocol, with detection.

This distribution ships no environment yet: it installs and imports on its own,
and registers nothing.
"""
