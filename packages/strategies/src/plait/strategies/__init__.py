"""Strategies: how a model is spread over processes and devices.

`Strategy` (the base class to subclass, also named `BaseStrategy`),
`SingleDeviceStrategy` (one process), `ParallelStrategy` (processes in a
torch.distributed group, with the collective contract checked), `DDPStrategy` and
`DDPShardedStrategy` (optimizer state sharded), `FSDPStrategy` (everything sharded, on
FSDP2; ``plait.strategies.fsdp`` holds its parts), `ModelParallelStrategy` (tensor,
sequence, context and data parallelism on one DeviceMesh, the module's own plan;
``plait.strategies.context_parallel`` holds the attention a split sequence needs),
`DeepSpeedStrategy` (ZeRO through
DeepSpeed, behind the ``deepspeed`` extra; ``plait.strategies.deepspeed``),
each meeting the `plait.core.Strategy` protocol, usable with or without a trainer.
The families beyond DDP and one process are imported when first named, here or in
`StrategyRegistry`.
`StrategyRegistry` (from `plait.core`) names them; `CheckpointIO` is a base class for
checkpoint IOs of your own; `init_distributed` forms a process group for a loop of
your own; `consolidate_checkpoint` turns any checkpoint a strategy wrote into one
file plain PyTorch loads. The process group a strategy joins lives as long as the
job (`plait.strategies.job`): `end_job` ends it before the program does.
"""

import importlib
from typing import TYPE_CHECKING, Final

from plait.core import StrategyRegistry
from plait.strategies.base import BaseStrategy
from plait.strategies.checkpoint_io import CheckpointIO
from plait.strategies.collectives import DistributedCollectives, LocalCollectives
from plait.strategies.ddp import DDPStrategy
from plait.strategies.export import consolidate_checkpoint
from plait.strategies.job import end_job
from plait.strategies.parallel import PROCESS_GROUP_BACKENDS, ParallelStrategy
from plait.strategies.process_group import init_distributed
from plait.strategies.single_device import SingleDeviceStrategy
from plait.strategies.state import UnreadEntryError

if TYPE_CHECKING:
    from plait.strategies.deepspeed import DeepSpeedStrategy
    from plait.strategies.dp import DataParallelStrategy
    from plait.strategies.fsdp import DDPFullyShardedNativeStrategy, FSDPStrategy
    from plait.strategies.model_parallel import ModelParallelStrategy
    from plait.strategies.sharded import DDPShardedStrategy
    from plait.strategies.xla import SingleDeviceXLAStrategy, XLAFSDPStrategy, XLAStrategy

Strategy = BaseStrategy
"""The base class to subclass for a strategy of your own: `BaseStrategy` by its other name.

`plait.core.Strategy` is the Protocol every strategy meets (a trainer or a loop of
your own needs only that); this is the class that implements it, parts and
checkpoints included, as ``from plait.strategies import Strategy`` in code written
for Lightning expects.
"""

__all__ = [
    "PROCESS_GROUP_BACKENDS",
    "BaseStrategy",
    "CheckpointIO",
    "DDPFullyShardedNativeStrategy",
    "DDPShardedStrategy",
    "DDPStrategy",
    "DataParallelStrategy",
    "DeepSpeedStrategy",
    "DistributedCollectives",
    "FSDPStrategy",
    "LocalCollectives",
    "ModelParallelStrategy",
    "ParallelStrategy",
    "SingleDeviceStrategy",
    "SingleDeviceXLAStrategy",
    "Strategy",
    "StrategyRegistry",
    "UnreadEntryError",
    "XLAFSDPStrategy",
    "XLAStrategy",
    "consolidate_checkpoint",
    "end_job",
    "init_distributed",
]

_FAMILIES: Final = {
    "DataParallelStrategy": "plait.strategies.dp",
    "DDPFullyShardedNativeStrategy": "plait.strategies.fsdp",
    "DDPShardedStrategy": "plait.strategies.sharded",
    "DeepSpeedStrategy": "plait.strategies.deepspeed",
    "FSDPStrategy": "plait.strategies.fsdp",
    "ModelParallelStrategy": "plait.strategies.model_parallel",
    "SingleDeviceXLAStrategy": "plait.strategies.xla",
    "XLAFSDPStrategy": "plait.strategies.xla",
    "XLAStrategy": "plait.strategies.xla",
}
"""The families a process may never use, by the module that holds each: imported when
first named (``from plait.strategies import FSDPStrategy``), so that a process on DDP or
one device imports none of them. Their modules import nothing from this package's
``__init__``: naming one late hides no import circle."""


if not TYPE_CHECKING:  # type checkers read the imports above, and refuse any other name

    def __getattr__(name: str) -> object:
        home = _FAMILIES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        found = getattr(importlib.import_module(home), name)
        globals()[name] = found  # found directly from now on
        return found

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
