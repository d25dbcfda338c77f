"""`WholePipeline`: a network's pipeline where nothing splits it.

What ``Module.pipeline`` gives under a strategy without pipeline ranks, so that one
module runs everywhere. It needs no mesh and no schedule: a module of its own, apart
from the runtime that cuts a network into stages (`plait.strategies.pipeline`), so
that what reads it (the Trainer) stands on no strategy family.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from typing_extensions import override

from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.strategies.pipeline_plan import LossFunction

__all__ = ["WholePipeline"]


class WholePipeline(nn.Module):
    """A module's pipeline where nothing splits it: the module whole, then the loss.

    What ``Module.pipeline`` gives under a strategy without pipeline ranks (or with
    ``pipeline_parallel_size=1``), so that one module runs everywhere: its
    parameters, buffers and submodules are the network's own, under the same names
    (a checkpoint of either loads into the other), and calling it gives the loss of
    the network's output, to back-propagate as any loss.

    Args:
        network: The module the stages would be cut from.
        loss_fn: The loss of the network's output and the target.
    """

    def __init__(self, network: nn.Module, loss_fn: LossFunction) -> None:
        super().__init__()
        # The network's own tables: the same names, and the same tensors.
        self._modules = network._modules
        self._parameters = network._parameters
        self._buffers = network._buffers
        object.__setattr__(self, "network", network)
        self.loss_fn = loss_fn
        self.gradient_scale = 1.0

    network: nn.Module

    @property
    def parts(self) -> tuple[nn.Module, ...]:
        """The one part: the network."""
        return (self.network,)

    @override
    def forward(
        self, *args: torch.Tensor, target: torch.Tensor | None = None, **kwargs: object
    ) -> torch.Tensor:
        """The loss of the network's output on ``args`` (and ``kwargs``) against ``target``."""
        if target is None:
            raise ConfigurationError(
                "a pipeline computes the loss, and no target was given",
                fix="pass target= (the same on every rank: only the last stage reads it)",
            )
        return self.loss_fn(self.network(*args, **kwargs), target)

    @override
    def train(self, mode: bool = True) -> WholePipeline:
        self.network.training = mode
        return super().train(mode)
