"""DeepSpeed's ZeRO as a strategy: `DeepSpeedStrategy`, its checkpoints and their export.

Needs the ``plait-strategies[deepspeed]`` extra; deepspeed itself is imported only when
a strategy joins its process group (or a checkpoint is consolidated).
`consolidate_checkpoint` writes a checkpoint as one file plain PyTorch loads;
`fp32_state_dict` and `optimizer_state_dict` rebuild its weights and its optimizer's
state whole from ZeRO's partitions, in one process.
"""

from plait.strategies.deepspeed.checkpoint_io import DeepSpeedCheckpointIO
from plait.strategies.deepspeed.config import STAGES
from plait.strategies.deepspeed.export import (
    consolidate_checkpoint,
    fp32_state_dict,
    optimizer_state_dict,
)
from plait.strategies.deepspeed.strategy import DeepSpeedStrategy

__all__ = [
    "STAGES",
    "DeepSpeedCheckpointIO",
    "DeepSpeedStrategy",
    "consolidate_checkpoint",
    "fp32_state_dict",
    "optimizer_state_dict",
]
