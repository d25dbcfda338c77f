"""DeepSpeed's ZeRO as a strategy: `DeepSpeedStrategy`, its checkpoints and their export.

Needs the ``plait-strategies[deepspeed]`` extra; deepspeed itself is imported only when
a strategy joins its process group (or a checkpoint is consolidated).
`consolidate_checkpoint` (`plait.strategies.consolidate_checkpoint`, here too) writes a
checkpoint as one file plain PyTorch loads; `DeepSpeedFormat` is the registered format
through which every strategy reads one;
`fp32_state_dict` and `optimizer_state_dict` rebuild its weights and its optimizer's
state whole from ZeRO's partitions, in one process.
"""

from plait.strategies.deepspeed.checkpoint_io import DeepSpeedCheckpointIO
from plait.strategies.deepspeed.config import STAGES
from plait.strategies.deepspeed.export import fp32_state_dict, optimizer_state_dict
from plait.strategies.deepspeed.format import DeepSpeedFormat
from plait.strategies.deepspeed.strategy import DeepSpeedStrategy
from plait.strategies.export import consolidate_checkpoint

__all__ = [
    "STAGES",
    "DeepSpeedCheckpointIO",
    "DeepSpeedFormat",
    "DeepSpeedStrategy",
    "consolidate_checkpoint",
    "fp32_state_dict",
    "optimizer_state_dict",
]
