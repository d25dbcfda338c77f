"""Fully sharded data parallelism on FSDP2: `FSDPStrategy` and the functions it is made of.

`FSDPStrategy` (also under the name ``DDPFullyShardedNativeStrategy``) shards
parameters, gradients and optimizer state across ranks; `parallelize` holds the
ordered functions it applies, usable in a loop of your own; `consolidate_checkpoint`
(`plait.strategies.consolidate_checkpoint`, here too) turns a sharded checkpoint into
one file plain PyTorch loads.
"""

from plait.strategies.export import consolidate_checkpoint
from plait.strategies.fsdp.options import (
    SHARDING_STRATEGIES,
    STATE_DICT_TYPES,
    ShardingPlan,
    SizeBasedPolicy,
)
from plait.strategies.fsdp.strategy import FSDPStrategy

DDPFullyShardedNativeStrategy = FSDPStrategy
"""The name Lightning 1.x gave its native FSDP strategy; the same class."""

__all__ = [
    "SHARDING_STRATEGIES",
    "STATE_DICT_TYPES",
    "DDPFullyShardedNativeStrategy",
    "FSDPStrategy",
    "ShardingPlan",
    "SizeBasedPolicy",
    "consolidate_checkpoint",
]
