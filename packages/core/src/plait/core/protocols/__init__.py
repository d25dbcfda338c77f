"""The Protocols through which plait's packages meet, one concept each.

Packages never import each other's classes: they meet here. Optional capabilities
are separate Protocols (``Supports*``), checked once where parts are composed.
"""

from plait.core.protocols.accelerator import Accelerator, SupportsDeviceStats
from plait.core.protocols.checkpoint_format import CheckpointFormat, SupportsFormat
from plait.core.protocols.checkpoint_io import (
    CheckpointIO,
    SupportsAsyncCheckpoint,
    SupportsCollectiveIO,
    SupportsCopyCheckpoint,
    SupportsLoadInPlace,
    SupportsPartialCleanup,
    is_collective,
)
from plait.core.protocols.collectives import Collectives
from plait.core.protocols.environment import ClusterEnvironment
from plait.core.protocols.launcher import Launcher
from plait.core.protocols.precision import GradientClipAlgorithm, Precision
from plait.core.protocols.strategy import (
    PipelineModule,
    RunProgress,
    Stateful,
    Strategy,
    SupportsAccumulation,
    SupportsClosureOptimizers,
    SupportsContextParallel,
    SupportsContextParallelAttention,
    SupportsDeviceMesh,
    SupportsLauncher,
    SupportsLifecycleHooks,
    SupportsManualOptimization,
    SupportsModelShardedContext,
    SupportsNoSync,
    SupportsPipeline,
    SupportsProcessDataloader,
    SupportsReplace,
    SupportsShardedModule,
)

__all__ = [
    "Accelerator",
    "CheckpointFormat",
    "CheckpointIO",
    "ClusterEnvironment",
    "Collectives",
    "GradientClipAlgorithm",
    "Launcher",
    "PipelineModule",
    "Precision",
    "RunProgress",
    "Stateful",
    "Strategy",
    "SupportsAccumulation",
    "SupportsAsyncCheckpoint",
    "SupportsClosureOptimizers",
    "SupportsCollectiveIO",
    "SupportsContextParallel",
    "SupportsContextParallelAttention",
    "SupportsCopyCheckpoint",
    "SupportsDeviceMesh",
    "SupportsDeviceStats",
    "SupportsFormat",
    "SupportsLauncher",
    "SupportsLifecycleHooks",
    "SupportsLoadInPlace",
    "SupportsManualOptimization",
    "SupportsModelShardedContext",
    "SupportsNoSync",
    "SupportsPartialCleanup",
    "SupportsPipeline",
    "SupportsProcessDataloader",
    "SupportsReplace",
    "SupportsShardedModule",
    "is_collective",
]
