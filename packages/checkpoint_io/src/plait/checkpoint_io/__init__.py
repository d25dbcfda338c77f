"""Checkpoint I/O: how checkpoints are written and read.

`TorchCheckpointIO` (atomic ``torch.save`` files at paths or fsspec URLs, loaded with
``weights_only=True``), `AsyncCheckpointIO` (saves in a background thread on a
snapshot) and `DistributedCheckpointIO` (sharded ``torch.distributed.checkpoint``
directories), each meeting the `plait.core.CheckpointIO` protocol and registered in
`plait.core.CheckpointIORegistry` as ``torch``, ``async`` and ``distributed``; and the
formats they write, `FileFormat` and `DistributedFormat`, which every strategy reads
(`plait.core.CheckpointFormatRegistry`: ``file`` and ``distributed``).
"""

from plait.checkpoint_io.async_io import AsyncCheckpointIO, snapshot
from plait.checkpoint_io.formats import DistributedFormat, FileFormat
from plait.checkpoint_io.sharded import DistributedCheckpointIO
from plait.checkpoint_io.torch_io import TorchCheckpointIO
from plait.checkpoint_io.xla_io import XLACheckpointIO

__all__ = [
    "AsyncCheckpointIO",
    "DistributedCheckpointIO",
    "DistributedFormat",
    "FileFormat",
    "TorchCheckpointIO",
    "XLACheckpointIO",
    "snapshot",
]
