"""torch's switches a run sets: deterministic algorithms, cuDNN's benchmark, SyncBatchNorm."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final, Literal

import attrs
import torch

from plait.core import ConfigurationError, rank_zero_warn
from plait.trainer.layer_sync import LayerSync, TorchSyncBatchNorm

if TYPE_CHECKING:
    from plait.core import Strategy

__all__ = ["CUBLAS_WORKSPACE", "Deterministic", "TorchFlags"]

Deterministic = bool | Literal["warn"] | None
"""``True`` (deterministic algorithms only, others raise), ``"warn"`` (others warn),
``False`` (torch's default) or ``None`` (leave torch's setting as it is)."""

CUBLAS_WORKSPACE: Final = ":4096:8"
"""What ``CUBLAS_WORKSPACE_CONFIG`` is set to (unless set already) for a deterministic
run: cuBLAS refuses deterministic matrix products on CUDA 10.2+ without it."""

_SYNC_DEVICES: Final = ("cuda", "xpu", "hpu")


@attrs.frozen
class TorchFlags:
    """The switches, checked when the Trainer is made, set in every rank at each run.

    Attributes:
        deterministic: See `Deterministic`.
        benchmark: ``torch.backends.cudnn.benchmark``; ``None`` leaves it, except
            that a deterministic run turns it off.
        sync_batchnorm: Turn every ``BatchNorm*`` layer into ``SyncBatchNorm``
            before the strategy wraps the module, on several processes.
        layer_sync: What synchronises layers over the ranks (`TorchSyncBatchNorm`
            for ``sync_batchnorm``, or a `LayerSync` given as a plugin); ``None``.
    """

    deterministic: Deterministic = None
    benchmark: bool | None = None
    sync_batchnorm: bool = False
    layer_sync: LayerSync | None = attrs.field(
        default=attrs.Factory(
            lambda flags: TorchSyncBatchNorm() if flags.sync_batchnorm else None, takes_self=True
        )
    )

    @classmethod
    def resolve(
        cls,
        deterministic: object,
        benchmark: object,
        sync_batchnorm: object,
        layer_sync: LayerSync | None = None,
    ) -> TorchFlags:
        """Check the Trainer's arguments (``layer_sync``: the plugin given, if any).

        Raises:
            ConfigurationError: A value is not one of its choices, or a layer sync
                plugin is given with ``sync_batchnorm=True``.
        """
        if not (
            deterministic is None or isinstance(deterministic, bool) or deterministic == "warn"
        ):
            raise ConfigurationError.invalid_choice(
                "deterministic", deterministic, ["True", "False", "'warn'", "None"]
            )
        if not (benchmark is None or isinstance(benchmark, bool)):
            raise ConfigurationError.invalid_choice(
                "benchmark", benchmark, ["True", "False", "None"]
            )
        if not isinstance(sync_batchnorm, bool):
            raise ConfigurationError.invalid_choice(
                "sync_batchnorm", sync_batchnorm, ["True", "False"]
            )
        if deterministic and benchmark:
            rank_zero_warn(
                "deterministic and benchmark=True were both given: cuDNN's benchmark picks "
                "its algorithms by timing them, which can make the run differ from one "
                "time to the next; set benchmark=False (or leave it out) for reproducibility"
            )
        if sync_batchnorm and layer_sync is not None:
            raise ConfigurationError(
                f"sync_batchnorm=True and the layer sync plugin {layer_sync!r} were both "
                "given; one synchronises the layers",
                value=layer_sync,
                fix="drop sync_batchnorm=True (plugins=[TorchSyncBatchNorm()] is the same), "
                "or the plugin",
            )
        if sync_batchnorm:
            layer_sync = TorchSyncBatchNorm()
        return cls(
            deterministic=deterministic,
            benchmark=benchmark,
            sync_batchnorm=isinstance(layer_sync, TorchSyncBatchNorm),
            layer_sync=layer_sync,
        )

    def check_device(self, strategy: Strategy, processes: int) -> None:
        """Refuse ``sync_batchnorm`` where torch cannot synchronise batch norms.

        Raises:
            ConfigurationError: Several processes on a device whose ``SyncBatchNorm``
                torch refuses (the CPU, MPS).
        """
        device = strategy.root_device.type
        if self.sync_batchnorm and processes > 1 and device not in _SYNC_DEVICES:
            raise ConfigurationError(
                f"sync_batchnorm=True (TorchSyncBatchNorm) on {device}: torch's SyncBatchNorm "
                "synchronises only "
                f"on {', '.join(_SYNC_DEVICES)} devices, and raises at the first training "
                "batch on any other",
                value=device,
                fix="leave sync_batchnorm off on this accelerator, or train on GPUs",
            )

    def apply(self) -> None:
        """Set torch's switches in this process (every rank calls it at each run)."""
        if self.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        if self.deterministic == "warn":
            torch.use_deterministic_algorithms(mode=True, warn_only=True)
        elif isinstance(self.deterministic, bool):
            torch.use_deterministic_algorithms(self.deterministic)
        benchmark = self.benchmark
        if benchmark is None and self.deterministic:
            benchmark = False
        if benchmark is not None:
            torch.backends.cudnn.benchmark = benchmark

    def prepare(self, module: torch.nn.Module, processes: int) -> torch.nn.Module:
        """``module`` with its layers synchronised (`LayerSync.apply`), on several processes.

        Raises:
            ConfigurationError: The layer sync returned another module than it was given.
        """
        if self.layer_sync is None or processes <= 1:
            return module
        return _in_place(self.layer_sync, "apply", module, self.layer_sync.apply(module))

    def revert(self, module: torch.nn.Module, processes: int) -> torch.nn.Module:
        """Undo `prepare` when the run ends (`LayerSync.revert`), on several processes.

        Raises:
            ConfigurationError: The layer sync returned another module than it was given.
        """
        if self.layer_sync is None or processes <= 1:
            return module
        return _in_place(self.layer_sync, "revert", module, self.layer_sync.revert(module))


def _in_place(
    layer_sync: LayerSync, method: str, given: torch.nn.Module, returned: torch.nn.Module
) -> torch.nn.Module:
    if returned is not given:
        raise ConfigurationError(
            f"{type(layer_sync).__name__}.{method} returned another module than it was given; "
            "the Trainer runs the module you passed it, so its layers are converted in place",
            value=returned,
            fix=f"convert the module's layers in place in {method} and return the module itself",
        )
    return returned
