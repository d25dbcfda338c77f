"""Launchers: starting the ranks of a job, watching them, and stopping them all on failure."""

from plait.strategies.launchers.children import GRACE_PERIOD, die_with_parent, launch_variables
from plait.strategies.launchers.external import ExternalLauncher
from plait.strategies.launchers.multiprocessing import (
    MULTIPROCESSING_METHODS,
    MultiprocessingLauncher,
)
from plait.strategies.launchers.subprocess import LAUNCHED_VARIABLE, SubprocessScriptLauncher

__all__ = [
    "GRACE_PERIOD",
    "LAUNCHED_VARIABLE",
    "MULTIPROCESSING_METHODS",
    "ExternalLauncher",
    "MultiprocessingLauncher",
    "SubprocessScriptLauncher",
    "die_with_parent",
    "launch_variables",
]
