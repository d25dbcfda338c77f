"""The registries of each kind of part, filled by the packages that provide them.

Each is a `Registry` that loads its entry-point group on
first use, so a name such as ``"ddp"`` resolves without this package importing the
one that provides it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from typing_extensions import override

from plait.core.errors import CheckpointError
from plait.core.protocols import (
    Accelerator,
    CheckpointFormat,
    CheckpointIO,
    ClusterEnvironment,
    Precision,
    Strategy,
)
from plait.core.registry import Registry

if TYPE_CHECKING:
    from plait.core.typing import PathLike

__all__ = [
    "AcceleratorRegistry",
    "CheckpointFormatRegistry",
    "CheckpointIORegistry",
    "EnvironmentRegistry",
    "PrecisionRegistry",
    "StrategyRegistry",
    "detect_checkpoint_format",
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

CheckpointFormatRegistry: Final = Registry[CheckpointFormat](
    "checkpoint format",
    protocol=CheckpointFormat,
    entry_point_group="plait.checkpoint_formats",
    distribution="plait-checkpoint-io",
)
"""Checkpoint formats by name: ``"file"``, ``"distributed"``, ``"deepspeed"``, yours.

Factories take no arguments. A format registered here is read by every strategy
(`plait.core.CheckpointFormat`), and `plait.strategies.consolidate_checkpoint`
writes it as one file.
"""


def detect_checkpoint_format(path: PathLike) -> CheckpointFormat | None:
    """The registered format whose checkpoint ``path`` holds; ``None`` if none recognises it.

    Raises:
        CheckpointError: Two formats recognise it (their ``recognizes`` overlap: one
            of them must look closer).
    """
    found = [
        built
        for built in (CheckpointFormatRegistry.get(name) for name in CheckpointFormatRegistry)
        if built.recognizes(path)
    ]
    if len(found) > 1:
        raise CheckpointError(
            str(path),
            "is recognised by more than one checkpoint format: "
            + ", ".join(repr(built.name) for built in found),
            fix="make the recognizes() of one of those formats look closer (a marker file, "
            "the leading bytes), so that each checkpoint has one format",
        )
    return found[0] if found else None
