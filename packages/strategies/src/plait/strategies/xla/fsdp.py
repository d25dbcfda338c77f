"""Fully sharded data parallel training on XLA's SPMD: one process, every device of the mesh."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol, cast

import torch
from typing_extensions import override

from plait.core import CheckpointIO, CheckpointIORegistry, ConfigurationError
from plait.strategies.launchers import ExternalLauncher
from plait.strategies.xla import library
from plait.strategies.xla.single import SingleDeviceXLAStrategy

if TYPE_CHECKING:
    from plait.core import Accelerator, Launcher, Precision

__all__ = ["STATE_DICT_TYPES", "XLAFSDPStrategy"]

STATE_DICT_TYPES: Final = ("sharded", "full")
"""How `XLAFSDPStrategy` checkpoints: DCP directories of the shards, or one whole file."""

AXIS: Final = "fsdp"
"""The mesh axis parameters and batches are sharded along (torch_xla's SPMD FSDP's name)."""

AutoWrapPolicy = Callable[..., bool]
"""torch_xla's FSDP auto-wrap policy: ``(module, recurse, nonwrapped_numel) -> bool``."""


class _Wrapper(Protocol):
    def __call__(
        self,
        module: torch.nn.Module,
        *,
        mesh: library.DeviceMesh,
        auto_wrap_policy: AutoWrapPolicy | None = None,
    ) -> torch.nn.Module: ...


class _Planners(Protocol):
    SPMDSavePlanner: Callable[[], object]
    SPMDLoadPlanner: Callable[[], object]


class XLAFSDPStrategy(SingleDeviceXLAStrategy):
    """Fully sharded data parallel on torch_xla's SPMD: one process drives every device.

    Under SPMD, one program runs over a mesh of every XLA device of the process (TPU cores, or
    virtual CPU devices with ``CPU_NUM_DEVICES``): the module is wrapped in torch_xla's
    ``SpmdFullyShardedDataParallel``, which shards every parameter (and so its
    gradient and optimizer state) along the mesh's ``"fsdp"`` axis, and each batch is
    sharded along its first dimension, so every device computes on its slice. XLA's
    compiler inserts the gathers and reductions. The result is that of one device
    training on the whole batch.

    There is one process (world size 1): the loop sees whole tensors, its
    collectives are a single process's, and the data loader is not split.

    Making the strategy switches this process's XLA runtime to SPMD, which torch_xla
    needs before anything runs on an XLA device: make it first.

    Args:
        accelerator, precision, precision_plugin: As for `SingleDeviceXLAStrategy`.
        checkpoint_io: The checkpoint IO, or its name; when given, it is used whatever
            ``state_dict_type`` says.
        state_dict_type: How checkpoints are written by default: ``"sharded"``, DCP
            directories written with torch_xla's SPMD planners, each device's shard
            as it is; or ``"full"``, one torch file of whole CPU tensors (``"xla"``).
        auto_wrap_policy: torch_xla's FSDP auto-wrap policy, to wrap (and shard)
            submodules as units of their own, e.g. ``transformer_auto_wrap_policy``
            of ``torch_xla.distributed.fsdp.wrap``.
        parallel_devices: The devices, as the Trainer gives them (``devices=``): as
            many as this process has, since the mesh spans every one (torch_xla's
            SPMD meshes do).

    Raises:
        ConfigurationError: torch_xla is missing, an unknown ``state_dict_type``, an
            ``auto_wrap_policy`` that is not callable, or parallel devices other than
            every device of the process.
    """

    def __init__(
        self,
        *,
        accelerator: Accelerator | str | None = None,
        precision: Precision | str | None = None,
        precision_plugin: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
        state_dict_type: str = "sharded",
        auto_wrap_policy: AutoWrapPolicy | None = None,
        parallel_devices: Sequence[torch.device] | None = None,
    ) -> None:
        if state_dict_type not in STATE_DICT_TYPES:
            raise ConfigurationError.invalid_choice(
                "state_dict_type", state_dict_type, STATE_DICT_TYPES
            )
        if auto_wrap_policy is not None and not callable(auto_wrap_policy):
            raise ConfigurationError(
                f"auto_wrap_policy={auto_wrap_policy!r} is not callable",
                value=auto_wrap_policy,
                fix="pass a policy of torch_xla.distributed.fsdp.wrap, e.g. "
                "functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})",
            )
        for device in parallel_devices or ():
            library.require_xla_device(device)
        runtime = library.runtime()
        if not runtime.is_spmd():
            runtime.use_spmd()
        count = runtime.global_runtime_device_count()
        if parallel_devices is not None and len(parallel_devices) != count:
            raise ConfigurationError(
                f"{len(parallel_devices)} XLA devices were asked for, and xla_fsdp shards "
                f"over every device this process has: {count}",
                value=len(parallel_devices),
                choices=[str(count)],
                fix=f"ask for devices={count} (or 'auto'); to use fewer, make fewer visible "
                "(on the CPU, CPU_NUM_DEVICES sets how many virtual devices there are)",
            )
        self.state_dict_type = state_dict_type
        self.auto_wrap_policy = auto_wrap_policy
        self.num_devices = count
        numpy = importlib.import_module("numpy")
        self.mesh = library.spmd().Mesh(numpy.arange(count), (count,), (AXIS,))
        super().__init__(
            accelerator=accelerator,
            precision=precision,
            precision_plugin=precision_plugin,
            checkpoint_io=checkpoint_io or self._default_checkpoint_io(state_dict_type),
        )

    @staticmethod
    def _default_checkpoint_io(state_dict_type: str) -> CheckpointIO | str:
        if state_dict_type == "full":
            return "xla"
        planners = cast(
            "_Planners", importlib.import_module("torch_xla.experimental.distributed_checkpoint")
        )
        return CheckpointIORegistry.get(
            "distributed",
            save_planner=planners.SPMDSavePlanner,
            load_planner=planners.SPMDLoadPlanner,
        )

    @property
    def launcher(self) -> Launcher:
        """Nothing to start: this one process drives every device of the mesh."""
        return ExternalLauncher()

    @override
    def wrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Shard ``module``'s parameters along the mesh (torch_xla's SPMD FSDP)."""
        wrapper = cast(
            "_Wrapper",
            importlib.import_module(
                "torch_xla.experimental.spmd_fully_sharded_data_parallel"
            ).SpmdFullyShardedDataParallel,
        )
        return wrapper(module, mesh=self.mesh, auto_wrap_policy=self.auto_wrap_policy)

    @override
    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        inner = getattr(module, "_orig_module", None)
        return inner if isinstance(inner, torch.nn.Module) else module

    @override
    def _forward(
        self, module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> object:
        sharded_args = tuple(self.shard_batch(value) for value in args)
        sharded_kwargs = {key: self.shard_batch(value) for key, value in kwargs.items()}
        return super()._forward(module, sharded_args, sharded_kwargs)

    def shard_batch(self, batch: object) -> object:
        """``batch`` with each tensor on the device sharded along its first dimension.

        Mappings, lists and tuples are walked; scalars stay replicated.
        """
        if isinstance(batch, torch.Tensor):
            if batch.dim() >= 1 and batch.device.type == "xla":
                spec: tuple[str | None, ...] = (AXIS, *([None] * (batch.dim() - 1)))
                library.spmd().mark_sharding(batch, self.mesh, spec)
            return batch
        if isinstance(batch, dict):
            return {key: self.shard_batch(value) for key, value in batch.items()}
        if isinstance(batch, list):
            return [self.shard_batch(value) for value in batch]
        if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
            return tuple(self.shard_batch(value) for value in batch)
        return batch

    @override
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_devices={self.num_devices}, "
            f"state_dict_type={self.state_dict_type!r})"
        )
