"""Registers the built-in cluster environments (entry point ``plait.environments``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait.environments.detection import DETECTION_ORDER, detect_environment
from plait.environments.local import LocalEnvironment

if TYPE_CHECKING:
    from plait.core import ClusterEnvironment, Registry
    from plait.environments.base import BaseEnvironment

__all__ = ["register"]


def register(registry: Registry[ClusterEnvironment]) -> None:
    """Register each built-in environment under its name, and ``auto`` (the detected one)."""
    environments: tuple[type[BaseEnvironment], ...] = (LocalEnvironment, *DETECTION_ORDER)
    for environment in environments:
        doc = (environment.__doc__ or "").strip().splitlines()[0]
        registry.register(environment.name, environment.from_environ, description=doc)
    registry.register(
        "auto", detected_environment, description="the environment detect_environment() finds"
    )


def detected_environment() -> ClusterEnvironment:
    """The environment `detect_environment` finds for this process."""
    return detect_environment().environment
