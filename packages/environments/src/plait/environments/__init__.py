"""Cluster environments: local, TorchElastic, SLURM, LSF, Kubeflow, MPI and XLA,
each meeting the :class:`plait.core.ClusterEnvironment` protocol, with detection.

This distribution ships no environment yet: it installs and imports on its own,
and registers nothing.
"""
