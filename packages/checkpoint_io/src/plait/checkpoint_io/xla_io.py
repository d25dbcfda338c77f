"""Checkpoints of state held on XLA devices: copied to the CPU, then saved as torch files."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from plait.checkpoint_io.torch_io import TorchCheckpointIO

if TYPE_CHECKING:
    from plait.core.typing import PathLike

__all__ = ["XLACheckpointIO", "to_cpu"]


def to_cpu(value: object) -> object:
    """``value`` with every tensor off the CPU replaced by a CPU copy.

    Mappings, lists and tuples are rebuilt (a named tuple as its own type); anything
    else is returned as it is.
    """
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "cpu" else value.detach().to("cpu")
    if isinstance(value, Mapping):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_cpu(item) for item in value]
    if isinstance(value, tuple):
        items = [to_cpu(item) for item in value]
        if hasattr(value, "_fields"):  # a named tuple: rebuilt by field
            rebuild: Callable[..., object] = type(value)
            return rebuild(*items)
        return tuple(items)
    return value


class XLACheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` for state on XLA devices: every tensor is copied to the CPU first.

    A tensor on an XLA device is a handle to a buffer the runtime holds (and, before
    the graph is run, to a computation); pickling it would save the handle, which no
    other process can read. Copying it to the CPU runs whatever computation is
    pending, so the file holds the values. Loading reads CPU tensors; the strategy
    copies them into the module's tensors on their device. The file loads anywhere,
    without torch_xla.
    """

    @override
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Copy ``checkpoint``'s tensors to the CPU and write it as a torch file.

        Raises:
            CheckpointError: It cannot be serialised or written.
        """
        on_cpu = to_cpu(checkpoint)
        assert isinstance(on_cpu, dict)
        super().save_checkpoint(on_cpu, path)
