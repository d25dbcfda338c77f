"""Strategies: how a model is spread over processes and devices.

`SingleDeviceStrategy` (one process), `ParallelStrategy` (processes in a
torch.distributed group, with the collective contract checked), `DDPStrategy` and
`DDPShardedStrategy` (optimizer state sharded),
each meeting the `plait.core.Strategy` protocol, usable with or without a trainer.
"""

from plait.strategies.base import BaseStrategy
from plait.strategies.collectives import DistributedCollectives, LocalCollectives
from plait.strategies.ddp import DDPStrategy
from plait.strategies.dp import DataParallelStrategy
from plait.strategies.parallel import PROCESS_GROUP_BACKENDS, ParallelStrategy
from plait.strategies.sharded import DDPShardedStrategy
from plait.strategies.single_device import SingleDeviceStrategy

__all__ = [
    "PROCESS_GROUP_BACKENDS",
    "BaseStrategy",
    "DDPShardedStrategy",
    "DDPStrategy",
    "DataParallelStrategy",
    "DistributedCollectives",
    "LocalCollectives",
    "ParallelStrategy",
    "SingleDeviceStrategy",
]
