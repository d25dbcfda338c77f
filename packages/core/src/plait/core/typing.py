"""Public type aliases shared by every plait package."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeAlias, Union

from plait.core.reduce_op import ReduceOp

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "Checkpoint",
    "DeviceSpec",
    "Group",
    "PathLike",
    "ReduceOpLike",
    "SignalHandler",
    "StateDict",
]

PathLike: TypeAlias = str | os.PathLike[str]
"""A local path or an fsspec URL such as ``memory://ckpt/last.pt``."""

DeviceSpec: TypeAlias = int | str | Sequence[int]
"""Devices as users write them: ``2``, ``"2"``, ``[0, 2]``, ``"0,2"``, ``-1``, ``"auto"``."""

ReduceOpLike: TypeAlias = ReduceOp | str
"""A `ReduceOp` or one of its spellings, e.g. ``"sum"`` or ``"avg"``."""

# Union with a forward reference, not a string: ``Group | None`` must work at run
# time, and plait.core does not import torch.
Group: TypeAlias = Union["ProcessGroup", str]
"""A sub-group of the job for a collective: a torch.distributed process group, or the
name of a dimension of the strategy's layout (``"data_parallel"``, ``"tensor"``, ...)."""

# The values of state and checkpoint dictionaries are heterogeneous by nature
# (tensors, nested dictionaries, numbers, RNG states) and are read back by key with the
# caller knowing each one's type: no narrower type than Any describes them.
StateDict: TypeAlias = dict[str, Any]
"""The state of a module, optimizer or plugin, as ``state_dict()`` returns it."""

Checkpoint: TypeAlias = dict[str, Any]
"""A whole checkpoint: named state dictionaries and metadata."""

SignalHandler: TypeAlias = Callable[[int, FrameType | None], object] | int | signal.Handlers | None
"""What `signal.signal` takes and returns: a function, ``SIG_DFL`` or ``SIG_IGN``, or None."""
