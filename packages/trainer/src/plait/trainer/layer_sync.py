"""Layer synchronisation plugins: layers that compute over every rank's batch (SyncBatchNorm).

As Lightning's ``plugins=[TorchSyncBatchNorm()]`` (or ``sync_batchnorm=True``): before
the strategy wraps the module, on several processes, `LayerSync.apply` turns its
layers into synchronised ones; when the run ends, `LayerSync.revert` turns them back,
so that the module trains and evaluates in one process afterwards as it did before.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch.nn.modules.batchnorm import _BatchNorm
from typing_extensions import override

__all__ = ["LayerSync", "TorchSyncBatchNorm"]


@runtime_checkable
class LayerSync(Protocol):
    """Turns a module's layers into ones synchronised over the ranks, and back.

    Both convert the module in place and return it: the Trainer runs the module it
    was given (a conversion that returns another module is refused).
    """

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """Synchronise ``model``'s layers over the ranks."""
        ...

    def revert(self, model: torch.nn.Module) -> torch.nn.Module:
        """Undo `apply`."""
        ...


class _BatchNormXd(_BatchNorm):
    """A batch norm of any input's dimensions: what a reverted ``SyncBatchNorm`` becomes.

    ``SyncBatchNorm`` takes inputs of any dimensions and does not record which
    ``BatchNorm*d`` it was made from.
    """

    @override
    def _check_input_dim(self, input: torch.Tensor) -> None:
        # SyncBatchNorm checks nothing beyond two dimensions either.
        if input.dim() < 2:
            raise ValueError(f"expected an input of at least 2 dimensions, got {input.dim()}")


class TorchSyncBatchNorm:
    """Every ``BatchNorm*d`` layer becomes torch's ``SyncBatchNorm``, holding its parameters.

    What ``Trainer(sync_batchnorm=True)`` does; `revert` turns each ``SyncBatchNorm``
    back into a batch norm holding the same parameters and running statistics.
    torch's ``SyncBatchNorm`` synchronises on CUDA, XPU and HPU devices.
    """

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` with each batch norm a ``SyncBatchNorm`` (converted in place)."""
        # torch's classmethod is unannotated; it returns the module it was given
        # (converted in place) unless the module is itself a batch norm.
        converted: torch.nn.Module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
        return converted

    def revert(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` with each ``SyncBatchNorm`` a batch norm again (converted in place)."""
        if isinstance(model, torch.nn.SyncBatchNorm):
            return _reverted(model)
        for name, child in model.named_children():
            reverted = self.revert(child)
            if reverted is not child:
                setattr(model, name, reverted)
        return model

    @override
    def __repr__(self) -> str:
        return "TorchSyncBatchNorm()"


def _reverted(layer: torch.nn.SyncBatchNorm) -> torch.nn.Module:
    plain = _BatchNormXd(
        layer.num_features,
        layer.eps,
        layer.momentum,
        layer.affine,
        layer.track_running_stats,
    )
    if layer.affine:
        with torch.no_grad():
            plain.weight = layer.weight
            plain.bias = layer.bias
    plain.running_mean = layer.running_mean
    plain.running_var = layer.running_var
    plain.num_batches_tracked = layer.num_batches_tracked
    plain.train(layer.training)
    return plain
