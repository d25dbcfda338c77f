"""`FSDPStrategy`: fully sharded data parallelism on FSDP2 (``fully_shard``) over a device mesh."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from plait.core import ConfigurationError, TrainingSemantics
from plait.strategies import meta
from plait.strategies.fsdp import parallelize
from plait.strategies.fsdp.options import (
    backward_prefetch_depth,
    buffer_dtype_of,
    check_fully_shard_kwargs,
    module_policy,
    offload_policy,
    precision_policy,
    sharding_plan,
)
from plait.strategies.fsdp.options import (
    state_dict_type as parse_state_dict_type,
)
from plait.strategies.mesh import MeshStrategy
from plait.strategies.parallel import DEFAULT_START_TIMEOUT, DEFAULT_TIMEOUT, process_group_options
from plait.strategies.self_launching import check_start_method

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule

    from plait.core import Accelerator, CheckpointIO, ClusterEnvironment, Precision

__all__ = ["FSDPStrategy"]

_SHARDED_BY = "_plait_sharded_by"


class FSDPStrategy(MeshStrategy):
    """Fully sharded data parallel training with FSDP2 (``torch.distributed.fsdp.fully_shard``).

    Every rank holds ``1/world_size`` of each parameter, its gradient and its optimizer
    state; a block's parameters are gathered for its forward and backward, and its
    gradients are reduce-scattered. The module is prepared by ordered functions
    (`plait.strategies.fsdp.parallelize`): activation checkpointing, then sharding per
    block (innermost first), then the root, then backward prefetching, then (for a
    model built under `model_sharded_context`) materialisation of this rank's shards.

    ``accelerator``, ``parallel_devices``, ``cluster_environment``, ``precision``
    (``precision_plugin``), ``process_group_backend``, ``timeout``, ``start_timeout``
    and ``checked_collectives`` are `ParallelStrategy`'s.

    Args:
        checkpoint_io: The checkpoint IO, or its name; ``"distributed"`` for sharded
            checkpoints (the default), ``"torch"`` for full ones.
        cpu_offload: Keep parameters, gradients and optimizer state on the CPU between
            uses: ``True``, FSDP2's ``CPUOffloadPolicy`` or FSDP1's ``CPUOffload``.
        mixed_precision: FSDP2's ``MixedPrecisionPolicy`` or FSDP1's ``MixedPrecision``
            (whose ``buffer_dtype`` casts buffers); by default derived from the precision
            plugin: parameters gathered in its compute dtype, gradients reduced in its
            reduce dtype.
        activation_checkpointing: Blocks that recompute their forward in backward: a
            layer class, several, or a function ``module -> bool``.
        activation_checkpointing_policy: The same, under Lightning 2's name.
        auto_wrap_policy: Blocks sharded on their own (one all-gather each): layer
            classes, a function ``module -> bool``, `SizeBasedPolicy` (or FSDP1's
            ``ModuleWrapPolicy`` or ``partial(size_based_auto_wrap_policy, ...)``).
            ``None`` shards the model as one block.
        backward_prefetch: How many blocks ahead backward gathers parameters:
            ``None`` (FSDP2's implicit prefetch of one), ``"BACKWARD_PRE"`` (or FSDP1's
            enum: one block, explicitly), or an int.
        sharding_strategy: ``"FULL_SHARD"`` (parameters freed after forward),
            ``"SHARD_GRAD_OP"`` (kept until backward), ``"NO_SHARD"`` (replicated, as
            DDP), ``"HYBRID_SHARD"`` / ``"HYBRID_SHARD_ZERO2"`` (sharded within a group
            of ranks, replicated across groups); FSDP1's enum is understood.
        state_dict_type: ``"sharded"``: every rank saves and loads its shards (a
            checkpoint saved by one world size loads in another); ``"full"``: the whole
            state gathered on rank 0, a file plain PyTorch can load.
        device_mesh: For the hybrid strategies, ``(replicas, shard_size)``; by default
            one replica per node, sharded across its processes.
        start_method: How the ranks are started when no scheduler did: ``"popen"`` (run
            the program again) or one of torch.multiprocessing's.
        **kwargs: Passed to ``fully_shard`` (e.g. ``reshard_after_forward=2``),
            checked against its parameters when the strategy is made.

    Raises:
        ConfigurationError: An option FSDP2 cannot honour (the replacement is
            named), a value of the wrong kind, or a checkpoint IO that does not fit
            ``state_dict_type``.
    """

    def __init__(
        self,
        *,
        accelerator: Accelerator | str | None = None,
        parallel_devices: Sequence[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | str | None = None,
        precision: Precision | str | None = None,
        precision_plugin: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
        cpu_offload: object = None,
        mixed_precision: object = None,
        activation_checkpointing: object = None,
        activation_checkpointing_policy: object = None,
        auto_wrap_policy: object = None,
        backward_prefetch: object = None,
        sharding_strategy: object = "FULL_SHARD",
        state_dict_type: object = "sharded",
        device_mesh: tuple[int, int] | None = None,
        start_method: str = "popen",
        process_group_backend: str | None = None,
        timeout: timedelta = DEFAULT_TIMEOUT,
        start_timeout: timedelta = DEFAULT_START_TIMEOUT,
        checked_collectives: bool = True,
        **kwargs: object,
    ) -> None:
        if activation_checkpointing is not None and activation_checkpointing_policy is not None:
            raise ConfigurationError(
                "activation_checkpointing and activation_checkpointing_policy are the same "
                "option under two names, and both were given",
                fix="pass one of them",
            )
        check_start_method(start_method)
        self.plan = sharding_plan(sharding_strategy)
        self.state_dict_type = parse_state_dict_type(state_dict_type)
        self.activation_checkpointing = module_policy(
            "activation_checkpointing",
            activation_checkpointing
            if activation_checkpointing is not None
            else activation_checkpointing_policy,
        )
        if not (self.activation_checkpointing is None or callable(self.activation_checkpointing)):
            raise ConfigurationError(
                "activation_checkpointing takes layer classes or a function module -> bool, "
                "not a size-based policy",
                value=self.activation_checkpointing,
                fix="pass activation_checkpointing={TransformerBlock}",
            )
        self.auto_wrap_policy = module_policy("auto_wrap_policy", auto_wrap_policy)
        self.backward_prefetch = backward_prefetch_depth(backward_prefetch)
        self.device_mesh_shape = self._check_mesh_shape(device_mesh)
        check_fully_shard_kwargs(kwargs)
        self.fully_shard_kwargs = dict(kwargs)
        if mixed_precision is not None:  # checked now, applied at set-up
            precision_policy(mixed_precision, torch.float32, torch.float32, torch.float32)
        self.mixed_precision = mixed_precision
        if checkpoint_io is None:
            checkpoint_io = "distributed" if self.state_dict_type == "sharded" else "torch"
        super().__init__(**process_group_options(locals()))
        self.cpu_offload = offload_policy(cpu_offload, self.root_device)
        self._check_checkpoint_io()
        self.start_method = start_method
        self.blocks: list[FSDPModule] = []
        """The blocks sharded on their own, in forward order (after set-up)."""
        self.checkpointed: list[torch.nn.Module] = []
        """The blocks that recompute their forward in backward (after set-up)."""

    def _check_mesh_shape(self, shape: object) -> tuple[int, int] | None:
        if shape is None:
            return None
        if not self.plan.hybrid:
            raise ConfigurationError(
                f"device_mesh={shape!r} applies to the hybrid strategies, and "
                f"sharding_strategy is {self.plan.name}",
                value=shape,
                fix="pass sharding_strategy='HYBRID_SHARD' with it, or leave device_mesh out",
            )
        if (
            not isinstance(shape, tuple)
            or len(shape) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape)
        ):
            raise ConfigurationError(
                f"device_mesh={shape!r} must be a tuple (replicas, shard_size) of positive ints",
                value=shape,
                fix="pass e.g. device_mesh=(2, 8): 2 replicas, each sharded across 8 ranks",
            )
        return (shape[0], shape[1])

    def _check_checkpoint_io(self) -> None:
        if self.state_dict_type == "sharded" and not self.writes_collectively:
            raise ConfigurationError(
                f"state_dict_type='sharded' has every rank save its shards, and "
                f"{self.checkpoint_io!r} writes on rank 0 alone",
                value=self.checkpoint_io,
                fix="pass checkpoint_io='distributed' (the default), or state_dict_type='full'",
            )
        if self.state_dict_type == "full" and self.writes_collectively:
            raise ConfigurationError(
                f"state_dict_type='full' gathers the state on rank 0 for one file, and "
                f"{self.checkpoint_io!r} writes on every rank",
                value=self.checkpoint_io,
                fix="pass checkpoint_io='torch' (the default for 'full'), or "
                "state_dict_type='sharded'",
            )

    @override
    def setup_environment(self) -> None:
        """Join the process group, then build the device mesh over it."""
        super().setup_environment()
        if self._mesh is None:
            # One mesh per shape in a job: a module sharded over it in one run goes
            # on over it in the next, and no run makes groups of its own again.
            self._mesh = self.job_held(("device mesh", self._mesh_shape()), self._make_mesh)

    @property
    @override
    def shards_module(self) -> bool:
        """Each rank holds only its shards, unless ``NO_SHARD`` replicates them whole."""
        return not self.plan.replicate_only

    def _mesh_shape(self) -> tuple[int, int] | None:
        world = self.world_size
        if self.plan.replicate_only:
            return (world, 1)
        if not self.plan.hybrid:
            return None
        shape = self.device_mesh_shape
        if shape is None:
            per_node = self._ranks_per_node()
            shape = (world // per_node, per_node)
        if shape[0] * shape[1] != world:
            raise ConfigurationError(
                f"device_mesh={shape} holds {shape[0] * shape[1]} ranks, and the world has {world}",
                value=shape,
                fix="pass device_mesh=(replicas, shard_size) with "
                f"replicas * shard_size == {world}",
            )
        return shape

    def _ranks_per_node(self) -> int:
        # Counted, not assumed: every rank says which node it is on.
        mine = torch.tensor([self.cluster_environment.node_rank])
        nodes = self.all_gather(mine).flatten().tolist()
        counts = {node: nodes.count(node) for node in nodes}
        if len(set(counts.values())) != 1:
            raise ConfigurationError(
                f"hybrid sharding replicates across nodes, and the nodes hold different "
                f"numbers of ranks: {dict(sorted(counts.items()))}",
                value=counts,
                fix="pass device_mesh=(replicas, shard_size) to say how to group the ranks",
            )
        return next(iter(counts.values()))

    def _make_mesh(self) -> DeviceMesh:
        from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

        device_type = self.root_device.type
        shape = self._mesh_shape()
        if shape is None:
            return DeviceMesh.from_group(self.process_group, device_type, mesh_dim_names=("shard",))
        ranks = torch.arange(self.world_size).view(shape)
        shard, replicate = self.subgroup(ranks), self.subgroup(ranks.T)
        return DeviceMesh.from_group(
            [replicate, shard], device_type, mesh=ranks, mesh_dim_names=("replicate", "shard")
        )

    # The module.

    @override
    def wrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Checkpoint activations, shard the blocks and the root, prefetch, materialise."""
        from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415

        # The parameters' names, before sharding replaces them: optimizers made over
        # them are pointed at their sharded twins (`setup_optimizers`).
        self.remember_parameter_names(module)
        # Decided together: a launcher may hand one rank a fresh copy of the module
        # and another the module an earlier run sharded in place.
        generation = self.job_generation
        marks = {getattr(m, _SHARDED_BY, None) for m in module.modules()} - {None}
        stale = bool(marks - {generation})
        if self.reduce_boolean_decision(stale, all=False):
            raise ConfigurationError(
                "the module was sharded in an earlier job of this program (on "
                f"{'this rank' if stale else 'another rank'}), over a process group that "
                "has ended (FSDP2 shards a module object once)",
                value=type(module).__name__,
                fix="keep the job's process group between runs (it lives until the program "
                "ends, unless end_job() was called or a run failed), or build the module "
                "anew and load the checkpoint into it (strategy.load_checkpoint(path, model); "
                "with the Trainer, trainer.validate(Model(), ckpt_path='last'))",
            )
        if marks:
            # Sharded by an earlier run of this job: it goes on as it is.
            self.blocks = [
                m for m in module.modules() if isinstance(m, FSDPModule) and m is not module
            ]
            return module
        if any(isinstance(m, FSDPModule) for m in module.modules()):
            return module  # sharded already, by the user over a mesh of theirs
        on_meta = meta.is_meta(module)
        if on_meta:
            meta.check_materializable(module)
        buffer_dtype = buffer_dtype_of(self.mixed_precision)
        if buffer_dtype is not None:
            parallelize.cast_buffers(module, buffer_dtype)
        if self.activation_checkpointing is not None:
            assert callable(self.activation_checkpointing)  # checked when made
            self.checkpointed = parallelize.apply_activation_checkpointing(
                module, self.activation_checkpointing
            )
        precision = self.precision
        self.blocks = parallelize.apply_fully_shard(
            module,
            mesh=self.device_mesh,
            policy=self.auto_wrap_policy,
            reshard_after_forward=self.plan.reshard_after_forward,
            mp_policy=precision_policy(
                self.mixed_precision,
                compute_dtype=precision.compute_dtype,
                param_dtype=precision.param_dtype,
                reduce_dtype=precision.reduce_dtype,
            ),
            offload_policy=self.cpu_offload,
            options=self.fully_shard_kwargs,
        )
        if self.backward_prefetch is not None:
            parallelize.set_backward_prefetch(self.blocks, self.backward_prefetch)
        if on_meta:
            meta.materialize(module, self.root_device)
        for submodule in module.modules():  # which job's group the shards live on
            setattr(submodule, _SHARDED_BY, generation)
        return module

    @override
    def check_closure_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse: each rank holds a shard, from which a closure's optimizer would decide alone.

        Raises:
            ConfigurationError: Always, naming the optimizer and the fix.
        """
        self.refuse_closure_optimizer(
            optimizer, "FSDPStrategy shards them: each rank would decide from its own shard"
        )

    @override
    @contextlib.contextmanager
    def manual_optimization(self, module: torch.nn.Module) -> Iterator[None]:
        """A step run through ``module`` may run its own backward passes and steps.

        The step runs inside the root's forward, so only a block's own hooks (its
        forward, backward and reduce-scatter) can serve its parameters there: every
        parameter must sit in a block sharded on its own (``auto_wrap_policy``).

        Raises:
            ConfigurationError: Some parameters belong to the root alone.
        """
        blocks = [block for block in self.blocks if isinstance(block, torch.nn.Module)]
        in_blocks = {id(p) for block in blocks for p in block.parameters()}
        root_only = [name for name, p in module.named_parameters() if id(p) not in in_blocks]
        if root_only:
            shown = ", ".join(root_only[:3]) + (", ..." if len(root_only) > 3 else "")
            raise ConfigurationError(
                f"manual optimization on FSDP needs every parameter in a block sharded on "
                f"its own, and {len(root_only)} belong to the root alone ({shown}): the "
                "step's backward passes run inside the root's forward, where the root "
                "cannot reduce its gradients",
                value=root_only,
                fix="pass auto_wrap_policy={...} naming the layers that hold the "
                "parameters (e.g. FSDPStrategy(auto_wrap_policy={torch.nn.Linear})), or "
                "use automatic optimization",
            )
        yield

    @override
    def skip_gradient_sync(
        self, module: torch.nn.Module
    ) -> contextlib.AbstractContextManager[None]:
        """Accumulate unsharded gradients locally inside the block (no reduce-scatter).

        Raises:
            ConfigurationError: ``module`` is not the sharded module `setup_module`
                returned.
        """
        from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415

        # The root, or (a module the user sharded block by block) each sharded block.
        sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
        if not sharded:
            raise ConfigurationError(
                f"no_sync was given a {type(module).__name__} that FSDP did not shard, "
                "so there is no gradient reduction of it to skip",
                value=module,
                fix="pass the module setup_module (or setup_module_and_optimizers) returned",
            )
        return _gradient_sync_off(sharded)

    @override
    def teardown(self) -> None:
        """Forget the blocks; then reshard, forget the mesh and release (`MeshStrategy`)."""
        self.blocks = []
        self.checkpointed = []
        super().teardown()

    @property
    @override
    def training_semantics(self) -> TrainingSemantics:
        """Synchronous replicas, bit-for-bit resumes; a checkpoint moves to DDP.

        A checkpoint resumes at another world size: its shards are laid out again.
        Each rank keeps its own buffers (FSDP never broadcasts them).
        """
        return TrainingSemantics(
            compatible=("ddp",),
            precisions=("32-true", "bf16-mixed"),
            resizable=True,
            buffers="own",
        )

    @override
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sharding_strategy={self.plan.name!r}, "
            f"state_dict_type={self.state_dict_type!r}, world_size={self.world_size}, "
            f"device={str(self.root_device)!r})"
        )


@contextlib.contextmanager
def _gradient_sync_off(modules: Sequence[FSDPModule]) -> Iterator[None]:
    for module in modules:
        module.set_requires_gradient_sync(False, recurse=False)
    try:
        yield
    finally:
        for module in modules:
            module.set_requires_gradient_sync(True, recurse=False)
