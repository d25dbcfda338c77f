"""The registries of each kind of part, filled by the packages that provide them.

Each is a `Registry` that loads its entry-point group on
first use, so a name such as ``"ddp"`` resolves without this package importing the
one that provides it.
"""

from __future__ import annotations

from typing import Final

from typing_extensions import override

from plait.core.protocols import (
    Accelerator,
    CheckpointIO,
    ClusterEnvironment,
    Precision,
    Strategy,
)
from plait.core.registry import Registry

__all__ = [
    "AcceleratorRegistry",
    "CheckpointIORegistry",
    "EnvironmentRegistry",
    "PrecisionRegistry",
    "StrategyRegistry",
]


class _StrategyRegistry(Registry[Strategy]):
    def available_strategies(self) -> list[str]:
        """The registered strategy names, sorted."""
        return self.available()

    @override
    def __repr__(self) -> str:
        return "StrategyRegistry"


class _AcceleratorRegistry(Registry[Accelerator]):
    def available_accelerators(self) -> list[str]:
        """The registered accelerator names, sorted."""
        return self.available()

    @override
    def __repr__(self) -> str:
        return "AcceleratorRegistry"


class _PrecisionRegistry(Registry[Precision]):
    def available_precisions(self) -> list[str]:
        """The registered precision names, sorted."""
        return self.available()

    @override
    def __repr__(self) -> str:
        return "PrecisionRegistry"


StrategyRegistry: Final = _StrategyRegistry(
    "strategy",
    protocol=Strategy,
    entry_point_group="plait.strategies",
    distribution="plait-strategies",
)
"""Strategies by name: ``"ddp"``, ``"fsdp"``, ``"deepspeed_stage_2"``, yours."""

AcceleratorRegistry: Final = _AcceleratorRegistry(
    "accelerator",
    protocol=Accelerator,
    entry_point_group="plait.accelerators",
    distribution="plait-accelerators",
)
"""Accelerators by name: ``"cpu"``, ``"cuda"``, ``"mps"``, ``"xla"``, yours."""

PrecisionRegistry: Final = _PrecisionRegistry(
    "precision",
    protocol=Precision,
    entry_point_group="plait.precision",
    distribution="plait-precision",
)
"""Precision plugins by name: ``"32-true"``, ``"bf16-mixed"``, yours.

Factories are called with ``device_type=`` (``"cpu"``, ``"cuda"``, ...), the device the
model runs on, which mixed precision autocasts for: accept it in yours.
"""

CheckpointIORegistry: Final = Registry[CheckpointIO](
    "checkpoint IO",
    protocol=CheckpointIO,
    entry_point_group="plait.checkpoint_io",
    distribution="plait-checkpoint-io",
)
"""Checkpoint IO plugins by name: ``"torch"``, ``"async"``, yours."""

EnvironmentRegistry: Final = Registry[ClusterEnvironment](
    "cluster environment",
    protocol=ClusterEnvironment,
    entry_point_group="plait.environments",
    distribution="plait-environments",
)
"""Cluster environments by name: ``"local"``, ``"slurm"``, ``"torchelastic"``, yours."""
