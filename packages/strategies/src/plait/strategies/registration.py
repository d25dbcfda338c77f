"""Registers the built-in strategies (entry point ``plait.strategies``).

One process and the DDP family are registered as classes; the families a process
may never use (FSDP, DeepSpeed, XLA, the model-parallel mesh, DataParallel, DDP with
a sharded optimizer) by reference, imported when one of their names is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from plait.strategies.ddp import DDPStrategy
from plait.strategies.single_device import SingleDeviceStrategy

if TYPE_CHECKING:
    from plait.core import Registry, Strategy

__all__ = ["register"]

_XLA_SINGLE: Final = "plait.strategies.xla.single:SingleDeviceXLAStrategy"
_XLA: Final = "plait.strategies.xla.replicas:XLAStrategy"
_XLA_FSDP: Final = "plait.strategies.xla.fsdp:XLAFSDPStrategy"
_DDP_SHARDED: Final = "plait.strategies.sharded:DDPShardedStrategy"
_DP: Final = "plait.strategies.dp:DataParallelStrategy"
_FSDP: Final = "plait.strategies.fsdp.strategy:FSDPStrategy"
_MODEL_PARALLEL: Final = "plait.strategies.model_parallel:ModelParallelStrategy"
_DEEPSPEED: Final = "plait.strategies.deepspeed.strategy:DeepSpeedStrategy"


def register(registry: Registry[Strategy]) -> None:
    """Register the one-process strategies, the DDP family, FSDP, DeepSpeed, XLA and ``dp``.

    The DeepSpeed and XLA names are registered whether or not deepspeed or torch_xla
    is installed: choosing one without it raises an error that names the extra.
    """
    registry.register(
        "single_device", SingleDeviceStrategy, description="one process on one device"
    )
    registry.register_lazily("single_xla", _XLA_SINGLE, description="one process on one XLA device")
    registry.register_lazily(
        "xla",
        _XLA,
        description="data parallel over XLA devices (TPU), torch_xla's launcher",
    )
    registry.register_lazily(
        "xla_debug", _XLA, description="'xla' with torch_xla's debug output on",
        debug=True,
    )  # fmt: skip
    registry.register_lazily(
        "xla_fsdp", _XLA_FSDP,
        description="parameters and batches sharded over every XLA device (SPMD, one process)",
    )  # fmt: skip
    registry.register(
        "ddp", DDPStrategy, description="DDP, running the program again per rank",
        start_method="popen",
    )  # fmt: skip
    registry.register(
        "ddp_spawn", DDPStrategy, description="DDP, ranks spawned by torch.multiprocessing",
        start_method="spawn",
    )  # fmt: skip
    registry.register(
        "ddp_fork", DDPStrategy, description="DDP, ranks forked from this process",
        start_method="fork",
    )  # fmt: skip
    registry.register(
        "ddp_notebook", DDPStrategy, description="DDP from a notebook (ranks forked)",
        start_method="fork",
    )  # fmt: skip
    registry.register(
        "ddp_find_unused_parameters_true", DDPStrategy,
        description="DDP that tolerates parameters unused in a step",
        start_method="popen", find_unused_parameters=True,
    )  # fmt: skip
    # Lightning's names for DDP's default (find_unused_parameters=False), each launcher,
    # and for its unused parameters tolerated under the other launchers.
    for prefix, start_method in (
        ("ddp", "popen"),
        ("ddp_spawn", "spawn"),
        ("ddp_fork", "fork"),
        ("ddp_notebook", "fork"),
    ):
        registry.register(
            f"{prefix}_find_unused_parameters_false", DDPStrategy,
            description=f"'{prefix}' (find_unused_parameters=False, DDP's default)",
            start_method=start_method,
        )  # fmt: skip
        if prefix != "ddp":
            registry.register(
                f"{prefix}_find_unused_parameters_true", DDPStrategy,
                description=f"'{prefix}' that tolerates parameters unused in a step",
                start_method=start_method, find_unused_parameters=True,
            )  # fmt: skip
    registry.register_lazily(
        "ddp_sharded", _DDP_SHARDED,
        description="DDP with optimizer state sharded across ranks (ZeRO stage 1)",
        start_method="popen",
    )  # fmt: skip
    registry.register_lazily("dp", _DP, description="DataParallel over this machine's CUDA GPUs")
    registry.register_lazily(
        "fsdp", _FSDP,
        description="fully sharded: parameters, gradients, optimizer state split across ranks",
    )  # fmt: skip
    registry.register_lazily(
        "fsdp_cpu_offload", _FSDP,
        description="fully sharded, parameters and optimizer state kept on the CPU",
        cpu_offload=True,
    )  # fmt: skip
    registry.register_lazily(
        "fsdp_native", _FSDP,
        description="fully sharded (the name Lightning 1.x used for 'fsdp')",
    )  # fmt: skip
    registry.register_lazily(
        "fsdp_native_full_shard_offload", _FSDP,
        description="fully sharded with CPU offload (Lightning 1.x's name)",
        cpu_offload=True,
    )  # fmt: skip
    registry.register_lazily(
        "model_parallel", _MODEL_PARALLEL,
        description="tensor, sequence and data parallelism on one DeviceMesh (the module's plan)",
    )  # fmt: skip
    registry.register_lazily(
        "ModelParallelStrategy", _MODEL_PARALLEL,
        description="the same, by Lightning's class name",
    )  # fmt: skip
    registry.register_lazily(
        "fsdp_shard_grad_op", _FSDP,
        description="sharded, parameters kept gathered from forward to backward (ZeRO-2)",
        sharding_strategy="SHARD_GRAD_OP",
    )  # fmt: skip
    registry.register_lazily(
        "fsdp_no_shard", _FSDP,
        description="FSDP's machinery with whole parameters on every rank (as DDP)",
        sharding_strategy="NO_SHARD",
    )  # fmt: skip
    registry.register_lazily(
        "fsdp_hybrid_shard", _FSDP,
        description="sharded within each node, replicated across nodes",
        sharding_strategy="HYBRID_SHARD",
    )  # fmt: skip
    registry.register_lazily(
        "deepspeed", _DEEPSPEED,
        description="DeepSpeed ZeRO (stage 2 unless its config says otherwise)",
    )  # fmt: skip
    registry.register_lazily(
        "deepspeed_stage_1", _DEEPSPEED,
        description="DeepSpeed ZeRO stage 1: optimizer state partitioned across ranks",
        stage=1,
    )  # fmt: skip
    registry.register_lazily(
        "deepspeed_stage_2", _DEEPSPEED,
        description="DeepSpeed ZeRO stage 2: optimizer state and gradients partitioned",
        stage=2,
    )  # fmt: skip
    registry.register_lazily(
        "deepspeed_stage_2_offload", _DEEPSPEED,
        description="DeepSpeed ZeRO stage 2, optimizer state kept and stepped on the CPU",
        stage=2, offload_optimizer=True,
    )  # fmt: skip
    registry.register_lazily(
        "deepspeed_stage_3", _DEEPSPEED,
        description="DeepSpeed ZeRO stage 3: parameters partitioned too",
        stage=3,
    )  # fmt: skip
    registry.register_lazily(
        "deepspeed_stage_3_offload", _DEEPSPEED,
        description="DeepSpeed ZeRO stage 3, parameters and optimizer state on the CPU",
        stage=3, offload_optimizer=True, offload_parameters=True,
    )  # fmt: skip
