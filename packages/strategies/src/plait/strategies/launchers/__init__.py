"""Launchers: starting the ranks of a job, watching them, and stopping them all on failure."""

from plait.strategies.launchers.children import GRACE_PERIOD, die_with_parent, launch_variables
from plait.strategies.launchers.multiprocessing import START_METHODS, MultiprocessingLauncher

__all__ = [
    "GRACE_PERIOD",
    "START_METHODS",
    "MultiprocessingLauncher",
    "die_with_parent",
    "launch_variables",
]
