"""plait.core: what every plait package shares, and nothing more.

The Protocols through which packages meet (`Accelerator`, `Precision`,
`CheckpointIO`, `ClusterEnvironment`, `Collectives`,
`Strategy`, `Launcher`), `ReduceOp`, the errors, the registries
of named parts, rank-aware helpers and seeding.

Importing it does not import torch.
"""

from plait.core.errors import (
    CheckpointError,
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ConfigurationError,
    MissingDependencyError,
    PeerFailedError,
    PlaitError,
)
from plait.core.fingerprint import CollectiveCall
from plait.core.imports import is_module_available, require_module
from plait.core.layout import NodeLayout, ProcessLayout, RankInfo
from plait.core.network import free_port
from plait.core.protocols import (
    Accelerator,
    CheckpointFormat,
    CheckpointIO,
    ClusterEnvironment,
    Collectives,
    GradientClipAlgorithm,
    Launcher,
    Precision,
    Stateful,
    Strategy,
    SupportsAsyncCheckpoint,
    SupportsClosureOptimizers,
    SupportsCollectiveIO,
    SupportsCopyCheckpoint,
    SupportsDeviceMesh,
    SupportsDeviceStats,
    SupportsFormat,
    SupportsLauncher,
    SupportsLoadInPlace,
    SupportsManualOptimization,
    SupportsModelShardedContext,
    SupportsNoSync,
    SupportsPartialCleanup,
    SupportsProcessDataloader,
    SupportsReplace,
    SupportsShardedModule,
    is_collective,
)
from plait.core.rank import (
    get_global_rank,
    rank_zero_debug,
    rank_zero_info,
    rank_zero_only,
    rank_zero_warn,
)
from plait.core.reduce_op import ReduceOp
from plait.core.registries import (
    AcceleratorRegistry,
    CheckpointFormatRegistry,
    CheckpointIORegistry,
    EnvironmentRegistry,
    PrecisionRegistry,
    StrategyRegistry,
    detect_checkpoint_format,
)
from plait.core.registry import Registry, RegistryEntry
from plait.core.seed import seed_everything, worker_init_fn
from plait.core.stopping import STOP_SIGNALS, TrainingStopped, stopped_by

__all__ = [
    "STOP_SIGNALS",
    "Accelerator",
    "AcceleratorRegistry",
    "CheckpointError",
    "CheckpointFormat",
    "CheckpointFormatRegistry",
    "CheckpointIO",
    "CheckpointIORegistry",
    "ClusterEnvironment",
    "CollectiveCall",
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "Collectives",
    "ConfigurationError",
    "EnvironmentRegistry",
    "GradientClipAlgorithm",
    "Launcher",
    "MissingDependencyError",
    "NodeLayout",
    "PeerFailedError",
    "PlaitError",
    "Precision",
    "PrecisionRegistry",
    "ProcessLayout",
    "RankInfo",
    "ReduceOp",
    "Registry",
    "RegistryEntry",
    "Stateful",
    "Strategy",
    "StrategyRegistry",
    "SupportsAsyncCheckpoint",
    "SupportsClosureOptimizers",
    "SupportsCollectiveIO",
    "SupportsCopyCheckpoint",
    "SupportsDeviceMesh",
    "SupportsDeviceStats",
    "SupportsFormat",
    "SupportsLauncher",
    "SupportsLoadInPlace",
    "SupportsManualOptimization",
    "SupportsModelShardedContext",
    "SupportsNoSync",
    "SupportsPartialCleanup",
    "SupportsProcessDataloader",
    "SupportsReplace",
    "SupportsShardedModule",
    "TrainingStopped",
    "detect_checkpoint_format",
    "free_port",
    "get_global_rank",
    "is_collective",
    "is_module_available",
    "rank_zero_debug",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "require_module",
    "seed_everything",
    "stopped_by",
    "worker_init_fn",
]
