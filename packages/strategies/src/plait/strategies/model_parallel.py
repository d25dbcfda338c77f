"""`ModelParallelStrategy`: data, context, tensor and sequence parallelism on one DeviceMesh.

The strategy builds the mesh and never guesses a plan: the user's module parallelizes
itself over it (``parallelize_module`` for tensor and sequence parallelism on
``mesh["tp"]``, `context_parallel_attention` over ``cp``, then ``fully_shard`` on
`ModelParallelStrategy.data_parallel_mesh`), as a torchtitan ``parallelize`` function
does. The module's state then lives as DTensors, saved and
loaded through ``torch.distributed.checkpoint`` by every rank (`MeshStrategy`), so a
checkpoint written on one mesh shape loads on another.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.core import ConfigurationError, ProcessLayout, TrainingSemantics
from plait.strategies import meta
from plait.strategies.context_parallel import ContextParallel
from plait.strategies.mesh import MeshStrategy, check_parallelized, names_parts_as_whole
from plait.strategies.mesh_build import build_mesh
from plait.strategies.mesh_plan import (
    FLATTENED_DIMENSIONS,
    MESH_DIMENSIONS,
    MeshDim,
    MeshShape,
    MeshSizes,
    Size,
)
from plait.strategies.parallel import DEFAULT_START_TIMEOUT, DEFAULT_TIMEOUT, process_group_options
from plait.strategies.pipeline_parallel import PipelineParallel
from plait.strategies.self_launching import check_start_method

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.device_mesh import DeviceMesh

    from plait.core import (
        Accelerator,
        CheckpointIO,
        ClusterEnvironment,
        Collectives,
        GradientClipAlgorithm,
        Precision,
    )
    from plait.core.typing import StateDict
    from plait.strategies.collectives import DistributedCollectives
    from plait.strategies.pipeline import Pipeline
    from plait.strategies.pipeline_plan import LossFunction

__all__ = [
    "FLATTENED_DIMENSIONS",
    "MESH_DIMENSIONS",
    "MeshDim",
    "MeshShape",
    "MeshSizes",
    "ModelParallelStrategy",
]


class ModelParallelStrategy(MeshStrategy):
    """Tensor, context, sequence and data parallelism on one `DeviceMesh`, as torchtitan trains.

    The strategy joins the process group and builds a named mesh of
    ``(dp_replicate, dp_shard, tp)``, with ``cp`` before ``tp`` when
    ``context_parallel_size > 1`` (`MESH_DIMENSIONS`): `device_mesh`. The
    module parallelizes itself over it: under the Trainer in ``configure_model``
    (reading ``self.device_mesh``), in a loop of your own before `setup_module`;
    typically ``parallelize_module(block, mesh["tp"], plan)`` per block, then
    ``fully_shard`` per block and on the root over `data_parallel_mesh` (which is
    ``mesh["dp_shard"]`` without replicas or context parallelism).

    With ``context_parallel_size > 1`` every sequence is split over the ``cp``
    ranks: each takes its tokens with `shard_sequence` (and their global positions
    with `sequence_positions`), and the module's attention calls
    `context_parallel_attention` with ``group=strategy.context_parallel_group``
    where it would call ``scaled_dot_product_attention``. FSDP then shards over
    ``dp_shard`` and ``cp`` together (`data_parallel_mesh`), which sums the
    context-parallel ranks' gradients of each parameter.

    Data is sharded by the data-parallel coordinates (`layout`): the ranks of one
    tensor- or context-parallel group read the same batches. Collectives take
    ``group="dp"``, ``"tp"``, ``"cp"``, ``"dp_shard"``, ``"dp_replicate"``,
    ``"dp_shard_cp"``, ``"dp_cp"`` (`FLATTENED_DIMENSIONS`; a loss over every token
    of a step is averaged over ``"dp_cp"``), or ``"data_parallel"`` (the name every
    strategy knows, ``"dp"``) to run within this rank's group along it.
    Checkpoints are written by every rank through ``torch.distributed.checkpoint``
    and load on any mesh shape; `full_module_state` gathers the whole state on
    rank 0 only when asked.

    ``accelerator``, ``parallel_devices``, ``cluster_environment``, ``precision``
    (``precision_plugin``), ``process_group_backend``, ``timeout``, ``start_timeout``
    and ``checked_collectives`` are `ParallelStrategy`'s.

    Args:
        data_parallel_size: Ranks that read different data (``dp_replicate`` times
            ``dp_shard``); ``"auto"``: what ``tensor_parallel_size`` leaves of the
            world (with both ``"auto"``: the number of nodes).
        tensor_parallel_size: Ranks each layer is split over; ``"auto"``: what
            ``data_parallel_size`` leaves (with both ``"auto"``: the processes of a
            node).
        data_parallel_replicate_size: Of the data-parallel ranks, how many replicas
            (each sharded over ``data_parallel_size / data_parallel_replicate_size``
            ranks); 1: pure sharding.
        context_parallel_size: Ranks each sequence is split over (1: none).
        context_parallel_load_balancing: Each context-parallel rank holds chunks
            ``r`` and ``2W - 1 - r`` of ``2W`` of a sequence (as much causal attention
            work as the others); ``False``: the ``r``-th contiguous slice.
        checkpoint_io: The checkpoint IO, or its name; ``"distributed"`` (the
            default): every rank writes its shards.
        start_method: How the ranks are started when no scheduler did.

    Raises:
        ConfigurationError: A size that is neither a positive int nor ``"auto"`` (a
            context-parallel size that is not a positive int), a replica count that
            does not divide the data-parallel size, or a checkpoint IO that writes on
            rank 0 alone.
    """

    refuses_gradient_scaler: ClassVar[bool] = True
    """A gradient scaler cannot unscale DTensor gradients: ``"16-mixed"`` is refused
    everywhere, never turned into ``"bf16-mixed"`` on the CPU by the Trainer."""

    _groups: Mapping[str, dist.ProcessGroup | None] = {}
    _flattened: Mapping[str, DeviceMesh] = {}

    def __init__(
        self,
        *,
        data_parallel_size: Size = "auto",
        tensor_parallel_size: Size = "auto",
        data_parallel_replicate_size: int = 1,
        context_parallel_size: int = 1,
        context_parallel_load_balancing: bool = True,
        pipeline_parallel_size: int = 1,
        pipeline_schedule: str = "1F1B",
        pipeline_microbatches: int | None = None,
        pipeline_stages_per_rank: int | None = None,
        accelerator: Accelerator | str | None = None,
        parallel_devices: Sequence[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | str | None = None,
        precision: Precision | str | None = None,
        precision_plugin: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
        start_method: str = "popen",
        process_group_backend: str | None = None,
        timeout: timedelta = DEFAULT_TIMEOUT,
        start_timeout: timedelta = DEFAULT_START_TIMEOUT,
        checked_collectives: bool = True,
    ) -> None:
        self.mesh_sizes = MeshSizes(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            data_parallel_replicate_size=data_parallel_replicate_size,
            context_parallel_size=context_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
        )
        self.context_parallel = ContextParallel(self, context_parallel_load_balancing)
        self.pipeline_parallel = PipelineParallel(
            self, pipeline_schedule, pipeline_microbatches, pipeline_stages_per_rank
        )
        self._shape: MeshShape | None = None
        self.start_method = check_start_method(start_method)
        io = checkpoint_io if checkpoint_io is not None else "distributed"
        super().__init__(**process_group_options(locals(), checkpoint_io=io))
        self._check_plugins()

    def _check_plugins(self) -> None:
        if self.precision.needs_scaler:
            raise ConfigurationError(
                f"ModelParallelStrategy with {self.precision!r}: a gradient scaler cannot "
                "unscale the DTensor gradients of a parallelized module, so float16 "
                "mixed precision is not supported (Lightning refuses it too)",
                value=self.precision,
                fix="use precision='bf16-mixed' (no scaler needed) or '32-true'",
            )
        if not self.writes_collectively:
            raise ConfigurationError(
                f"ModelParallelStrategy has every rank write its shards, and "
                f"{self.checkpoint_io!r} writes on rank 0 alone",
                value=self.checkpoint_io,
                fix="pass checkpoint_io='distributed' (the default); export a whole "
                "state on demand with strategy.export_checkpoint(module, path)",
            )

    # The sizes and settings asked for, as the parts hold them.

    @property
    def data_parallel_size(self) -> Size:
        """As asked (``"auto"`` allowed): `mesh_shape` has the size resolved."""
        return self.mesh_sizes.data_parallel_size

    @property
    def tensor_parallel_size(self) -> Size:
        """As asked (``"auto"`` allowed): `mesh_shape` has the size resolved."""
        return self.mesh_sizes.tensor_parallel_size

    @property
    def data_parallel_replicate_size(self) -> int:
        """The data-parallel replicas asked for."""
        return self.mesh_sizes.data_parallel_replicate_size

    @property
    def context_parallel_size(self) -> int:
        """The ranks each sequence is split over."""
        return self.mesh_sizes.context_parallel_size

    @property
    def pipeline_parallel_size(self) -> int:
        """The ranks the model's stages are spread over."""
        return self.mesh_sizes.pipeline_parallel_size

    @property
    def context_parallel_load_balancing(self) -> bool:
        """Whether each ``cp`` rank holds chunks ``r`` and ``2W - 1 - r`` (`ContextParallel`)."""
        return self.context_parallel.load_balancing

    @property
    def pipeline_schedule(self) -> str:
        """The pipeline's schedule, as `pipeline_plan.SCHEDULES` spells it (`PipelineParallel`)."""
        return self.pipeline_parallel.schedule

    @property
    def pipeline_microbatches(self) -> int | None:
        """Microbatches a pipeline's step is cut into (``None``: its number of stages)."""
        return self.pipeline_parallel.microbatches

    @property
    def pipeline_stages_per_rank(self) -> int:
        """Stages each pipeline rank holds."""
        return self.pipeline_parallel.stages_per_rank

    # The mesh.

    @property
    def mesh_shape(self) -> MeshShape:
        """The mesh's sizes, resolved against the job's world (`MeshSizes.resolve`).

        Resolved once, when the strategy joins its job, and kept: every rank answers
        the job's shape during a run and after it. Before the strategy joins a job,
        the sizes resolved against the world it will start: in the process that
        launches the ranks (``fit`` under ``spawn`` or ``fork``, whose own world is of
        one), the world of the processes it launches, so that this process answers as
        its ranks do, before and after they run.

        Raises:
            ConfigurationError: Before the strategy joins a job, the sizes given do not
                make the world it will start.
        """
        if self._shape is not None:
            return self._shape
        world = self.world_size
        if world == 1 and not self.cluster_environment.creates_processes_externally:
            # The launching process: its ranks, one per parallel device, on this node.
            world = self.num_processes
        return self.mesh_sizes.resolve(world, self.num_nodes)

    @property
    @override
    def layout(self) -> ProcessLayout:
        """The data-parallel rank and size from the mesh, and the other dimensions' coordinates.

        Before the ranks exist (a launcher's process, which counts one), where the
        sizes cannot be laid out yet, the layout of that one process: the sizes are
        checked against the job's world when the strategy joins it.
        """
        shape = self._shape
        if shape is None or shape.world_size != self.world_size:
            try:
                shape = self.mesh_sizes.resolve(self.world_size, self.num_nodes)
            except ConfigurationError:
                if self._mesh is not None:
                    raise
                return super().layout
        where = shape.coordinates(self.global_rank)
        named = [
            *(name for name in (MeshDim.PIPELINE, MeshDim.CONTEXT) if shape.enabled(name)),
            MeshDim.TENSOR,
        ]
        return ProcessLayout(
            world_size=self.world_size,
            global_rank=self.global_rank,
            data_parallel_size=shape.data_parallel,
            data_parallel_rank=where[MeshDim.DATA],
            dimensions={name: shape.sizes[name] for name in named},
            coordinates={name: where[name] for name in named},
        )

    @override
    def make_collectives(self, distributed: DistributedCollectives) -> Collectives:
        """Plait's collectives, with ``group=`` naming the mesh's dimensions.

        The sizes are resolved against the job's world here, once, and kept
        (`mesh_shape`).
        """
        shape = self._shape = self.mesh_sizes.resolve(self.world_size, self.num_nodes)
        # One mesh per shape in a job: a module parallelized over it in one run goes
        # on over it in the next, and no run makes groups of its own again.
        self._mesh, groups, self._flattened = self.job_held(
            ("model parallel mesh", shape),
            lambda: build_mesh(
                shape,
                self.subgroup,
                device_type=self.root_device.type,
                backend=self.process_group_backend or dist.get_backend(),
                timeout=self.timeout,
            ),
        )
        self._groups = groups
        return distributed.with_dimensions(groups)

    @property
    def data_parallel_mesh(self) -> DeviceMesh:
        """The mesh FSDP shards the module over: ``fully_shard(block, mesh=...)``.

        ``dp_shard`` alone, or with context parallelism ``dp_shard_cp`` (``dp_shard``
        and ``cp`` flattened: the context-parallel ranks' gradients of a parameter
        are summed with the data-parallel ranks'); with replicas, 2-D: (``dp_replicate``,
        that), hybrid sharding.

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        mesh = self.device_mesh
        shape = self.mesh_shape
        if shape.context == 1:
            if shape.replicate > 1:
                return mesh[MeshDim.REPLICATE.value, MeshDim.SHARD.value]
            return mesh[MeshDim.SHARD.value]
        flat = self._flattened[MeshDim.SHARD_CONTEXT]
        if shape.replicate == 1:
            return flat
        with warnings.catch_warnings():
            # The flattened mesh is held here; torch warns of slicing one from the
            # root, which is the only public way to pair it with dp_replicate.
            warnings.filterwarnings("ignore", "Slicing a flattened dim", UserWarning)
            return mesh[MeshDim.REPLICATE.value, MeshDim.SHARD_CONTEXT.value]

    def mesh_group(self, dimension: MeshDim) -> dist.ProcessGroup | None:
        """This rank's group along ``dimension`` (``None``: the whole job).

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        _ = self.device_mesh
        return self._groups[dimension]

    @property
    def context_parallel_group(self) -> dist.ProcessGroup | None:
        """This rank's ``cp`` group, for `context_parallel_attention` (``None``: cp = 1).

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        _ = self.device_mesh
        return self.context_parallel.group

    @property
    def pipeline_group(self) -> dist.ProcessGroup | None:
        """This rank's ``pp`` group, over which stages pass activations (``None``: pp = 1).

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        _ = self.device_mesh
        return self.pipeline_parallel.group

    def accumulate(self, module: torch.nn.Module, batches: int) -> None:
        """A step follows ``batches`` backward passes: the pipelines in ``module`` scale by it.

        `plait.core.SupportsAccumulation`: the Trainer calls it before a run's first
        batch; a loop of your own that accumulates calls it once, before training.
        """
        self.pipeline_parallel.accumulate(module, batches)

    def pipeline(
        self,
        module: torch.nn.Module,
        loss_fn: LossFunction,
        *,
        units: Sequence[str] | None = None,
        stages: Sequence[Sequence[str]] | None = None,
        schedule: str | None = None,
        microbatches: int | None = None,
        stages_per_rank: int | None = None,
    ) -> Pipeline:
        """This rank's stages of ``module``, and the schedule to run them: a `Pipeline`.

        Declare the stages by ``units`` (submodule names in the order ``forward``
        runs them, split evenly) or by ``stages`` (one list of names per stage). Each
        part the rank holds is a copy of ``module`` with the other stages'
        submodules ``None`` (its ``forward`` skips those): parallelize and shard each
        part over the mesh as you would the whole module, then set the pipeline up
        with `setup_module` and make the optimizers over its parameters. Build the
        whole module first, the same on every rank (on the meta device under
        `model_sharded_context`, or seeded alike).

        ``schedule``, ``microbatches`` and ``stages_per_rank`` default to the
        strategy's ``pipeline_*`` arguments; the microbatches to the number of stages.
        With ``pipeline_parallel_size=1`` the pipeline holds every stage of one rank
        (GPipe or 1F1B with one stage: the whole module, run microbatch by microbatch).

        Raises:
            ConfigurationError: The stages do not fit the schedule or the module (a
                name that is not a submodule, one named twice, a parameter in no
                stage), or an unknown schedule.
        """
        return self.pipeline_parallel.pipeline(
            module,
            loss_fn,
            units=units,
            stages=stages,
            schedule=schedule,
            microbatches=microbatches,
            stages_per_rank=stages_per_rank,
        )

    def sequence_positions(self, length: int) -> torch.Tensor:
        """The global positions of the tokens this rank holds of a sequence of ``length``.

        All of them (``arange(length)``) without context parallelism; with it, this
        rank's ``cp`` slice (`plait.strategies.context_parallel.sequence_positions`),
        load-balanced as the strategy was asked.

        Raises:
            ConfigurationError: ``length`` does not split evenly over the ``cp`` ranks.
        """
        return self.context_parallel.sequence_positions(length)

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """`context_parallel_attention` of this rank's tokens over its ``cp`` group.

        Queries, keys and values are this rank's tokens
        (``(batch, heads, local_length, head_dim)``, as `shard_sequence` took them);
        a causal mask follows their global positions (`sequence_positions` of the
        whole length). Without context parallelism, ``scaled_dot_product_attention``.
        """
        _ = self.device_mesh
        return self.context_parallel.attention(query, key, value, is_causal=is_causal)

    def shard_sequence(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of ``tensor`` along ``dim`` (all of them without cp).

        Shard inputs and targets alike: the positions taken are
        ``sequence_positions(tensor.shape[dim])``.

        Raises:
            ConfigurationError: ``dim`` is not one of ``tensor``'s, or its length does
                not split evenly over the ``cp`` ranks.
        """
        return self.context_parallel.shard_sequence(tensor, dim)

    # The module.

    @override
    def wrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Check that the module was parallelized over the mesh, then materialise it.

        Raises:
            ConfigurationError: No parameter is a DTensor (nothing parallelized the
                module), or, with several data-parallel ranks, some parameters are
                not sharded over the data-parallel dimensions (their gradients would
                not be averaged).
        """
        self.remember_parameter_names(module)
        self._check_parallelized(module)
        if meta.is_meta(module):
            meta.check_materializable(module)
            meta.materialize(module, self.root_device)
        return module

    def _check_parallelized(self, module: torch.nn.Module) -> None:
        # The plan's checks (`plait.strategies.mesh.check_parallelized`), in a method a
        # subclass may replace.
        check_parallelized(module, self.mesh_shape)

    @override
    def check_closure_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse: each rank holds a shard, from which a closure's optimizer would decide alone.

        Raises:
            ConfigurationError: Always, naming the optimizer and the fix.
        """
        self.refuse_closure_optimizer(
            optimizer,
            "ModelParallelStrategy shards them: each rank would decide from its own shard",
        )

    @override
    def buffer_sources(self) -> list[tuple[dist.ProcessGroup | None, int]]:
        """Rank 0's buffers; under a pipeline, each stage's first rank's, within the stage.

        A stage's ranks hold its buffers, which another stage's do not: they are sent
        along ``dp``, ``cp`` and ``tp`` in turn from the rank whose coordinates there
        are 0 (`PipelineParallel.buffer_sources`).
        """
        if not self.pipeline_parallel.enabled:
            return super().buffer_sources()
        return self.pipeline_parallel.buffer_sources()

    @override
    def full_module_state(self, module: torch.nn.Module) -> StateDict:
        """The whole state on rank 0's CPU (empty elsewhere); under a pipeline, every stage's.

        Each stage's state is gathered whole within its ranks, then the stages' are
        gathered over ``pp`` to rank 0, keyed by the whole module's names.
        """
        if not self.pipeline_parallel.enabled or not names_parts_as_whole(module):
            return super().full_module_state(module)
        from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
            StateDictOptions,
        )

        # Whole on every rank of the stage (each stage's ranks gather their own).
        state = self._module_state(module, StateDictOptions(full_state_dict=True))
        return self.pipeline_parallel.whole_state(state)

    @override
    def _optimizer_state(
        self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, options: StateDictOptions
    ) -> StateDict:
        """The optimizer's state; under a pipeline, its groups list every stage's parameters.

        Each rank holds its stages' parameters: the names its groups list are
        gathered over ``pp``, so that a checkpoint's groups are the whole model's
        and load into an optimizer over the whole model (DDP's, one process's).
        """
        state = super()._optimizer_state(module, optimizer, options)
        if not self.pipeline_parallel.enabled or not names_parts_as_whole(module):
            return state
        return self.pipeline_parallel.whole_param_groups(state)

    @override
    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> torch.Tensor | None:
        """Clip by the norm of every gradient of the model, over all its pipeline stages.

        Without a pipeline, as every strategy clips (a DTensor's norm is its whole
        tensor's). With one, each rank holds its stages' gradients: their squared
        norms are summed over the ``pp`` group first (the largest magnitude, for
        ``"value"``, needs no sum: each rank clips its own).
        """
        if not self.pipeline_parallel.enabled or algorithm != "norm":
            return super().clip_gradients(module, optimizer, clip_val, algorithm)
        return self.pipeline_parallel.clip_norm(optimizer, clip_val)

    @property
    @override
    def training_semantics(self) -> TrainingSemantics:
        """Synchronous replicas, bit-for-bit resumes; the module parallelizes itself.

        The data-parallel ranks train as one process on their global batch, whatever
        the tensor-parallel split of the layers; a checkpoint resumes at another
        world size and mesh shape (its shards are laid out again). Each rank keeps
        its own buffers (FSDP never broadcasts them).
        """
        return TrainingSemantics(
            precisions=("32-true", "bf16-mixed"),
            resizable=True,
            parallelized_by_module=True,
            buffers="own",
        )

    @override
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(data_parallel_size={self.data_parallel_size!r}, "
            f"tensor_parallel_size={self.tensor_parallel_size!r}, "
            f"data_parallel_replicate_size={self.data_parallel_replicate_size}, "
            f"context_parallel_size={self.context_parallel_size}, "
            f"pipeline_parallel_size={self.pipeline_parallel_size}, "
            f"{self.size_text()}, device={str(self.root_device)!r})"
        )
