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
from plait.strategies.context_parallel import (
    context_parallel_attention,
    sequence_positions,
    shard_sequence,
)
from plait.strategies.mesh import MeshStrategy, is_dtensor, names_parts_as_whole
from plait.strategies.mesh_plan import (
    FLATTENED_DIMENSIONS,
    MESH_DIMENSIONS,
    MeshShape,
    MeshSizes,
    Size,
    check_size,
)
from plait.strategies.parallel import DEFAULT_START_TIMEOUT, DEFAULT_TIMEOUT, process_group_options
from plait.strategies.pipeline import schedule_name
from plait.strategies.pipeline import stages_per_rank as stages_per_rank_of
from plait.strategies.self_launching import check_start_method

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Backend as C10dBackend
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
    from plait.strategies.pipeline import LossFunction, Pipeline

__all__ = [
    "FLATTENED_DIMENSIONS",
    "MESH_DIMENSIONS",
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
        """The sizes asked for, checked: `MeshSizes.resolve` lays them out."""
        self.data_parallel_size = self.mesh_sizes.data_parallel_size
        self.tensor_parallel_size = self.mesh_sizes.tensor_parallel_size
        self.data_parallel_replicate_size = self.mesh_sizes.data_parallel_replicate_size
        self.context_parallel_size = self.mesh_sizes.context_parallel_size
        self.pipeline_parallel_size = self.mesh_sizes.pipeline_parallel_size
        if not isinstance(context_parallel_load_balancing, bool):
            raise ConfigurationError(
                f"context_parallel_load_balancing={context_parallel_load_balancing!r} is "
                "not a bool",
                value=context_parallel_load_balancing,
                fix="pass True (chunks r and 2W-1-r, for causal masks) or False",
            )
        self.context_parallel_load_balancing = context_parallel_load_balancing
        self.pipeline_schedule = schedule_name(pipeline_schedule)
        self.pipeline_stages_per_rank = stages_per_rank_of(
            self.pipeline_schedule, pipeline_stages_per_rank
        )
        if pipeline_microbatches is not None:
            check_size("pipeline_microbatches", pipeline_microbatches)
        self.pipeline_microbatches = pipeline_microbatches
        check_start_method(start_method)
        self.start_method = start_method
        super().__init__(
            **process_group_options(
                locals(),
                checkpoint_io=checkpoint_io if checkpoint_io is not None else "distributed",
            )
        )
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

    # The mesh.

    @property
    def mesh_shape(self) -> MeshShape:
        """The mesh's sizes, resolved against the job's world size (`MeshSizes.resolve`).

        Raises:
            ConfigurationError: The sizes given do not make the world size.
        """
        return self.mesh_sizes.resolve(self.world_size, self.num_nodes)

    @property
    @override
    def layout(self) -> ProcessLayout:
        """The data-parallel rank and size from the mesh, and the other dimensions' coordinates.

        Before the ranks exist (a launcher's process, which counts one), where the
        sizes cannot be laid out yet, the layout of that one process: the sizes are
        checked against the job's world when the strategy joins it.
        """
        try:
            shape = self.mesh_shape
        except ConfigurationError:
            if self._mesh is not None:
                raise
            return super().layout
        where = shape.coordinates(self.global_rank)
        named = [name for name in ("pp", "cp") if shape.sizes[name] > 1] + ["tp"]
        return ProcessLayout(
            world_size=self.world_size,
            global_rank=self.global_rank,
            data_parallel_size=shape.data_parallel,
            data_parallel_rank=where["dp"],
            dimensions={name: shape.sizes[name] for name in named},
            coordinates={name: where[name] for name in named},
        )

    @override
    def make_collectives(self, distributed: DistributedCollectives) -> Collectives:
        """Plait's collectives, with ``group=`` naming the mesh's dimensions."""
        shape = self.mesh_shape
        # One mesh per shape in a job: a module parallelized over it in one run goes
        # on over it in the next, and no run makes groups of its own again.
        self._mesh, groups, self._flattened = self.job_held(
            ("model parallel mesh", shape), lambda: self._make_mesh(shape)
        )
        self._groups = groups
        return distributed.with_dimensions(groups)

    def _make_mesh(
        self, shape: MeshShape
    ) -> tuple[DeviceMesh, dict[str, dist.ProcessGroup | None], dict[str, DeviceMesh]]:
        from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

        # Groups of their own, with the strategy's collective timeout: every rank
        # makes every group, in the same order.
        mine = [self.subgroup(shape.lines([name])) for name in MESH_DIMENSIONS]
        data_parallel = self.subgroup(shape.lines(FLATTENED_DIMENSIONS["dp"]))
        along = dict(zip(MESH_DIMENSIONS, mine, strict=True))
        names = shape.mesh_dimensions
        mesh = DeviceMesh.from_group(
            [along[name] for name in names],
            self.root_device.type,
            mesh=shape.ranks().view(*(shape.sizes[name] for name in names)),
            mesh_dim_names=names,
        )
        groups: dict[str, dist.ProcessGroup | None] = dict(along)
        whole = shape.data_parallel == shape.world_size
        groups["dp"] = groups["data_parallel"] = None if whole else data_parallel
        flattened: dict[str, DeviceMesh] = {}
        if shape.context == 1:
            # Without context parallelism these are the groups the mesh has already.
            groups["dp_shard_cp"] = groups["dp_shard"]
            groups["dp_cp"] = groups["dp"]
            return mesh, groups, flattened
        for name in ("dp_shard_cp", "dp_cp"):
            # A flattened mesh is what FSDP shards over; its group, made by torch,
            # takes the strategy's timeout through the backend's options.
            flattened[name] = mesh[FLATTENED_DIMENSIONS[name]]._flatten(
                name, backend_override=self._backend_options()
            )
            groups[name] = flattened[name].get_group()
        return mesh, groups, flattened

    def _backend_options(self) -> tuple[str, C10dBackend.Options]:
        backend = self.process_group_backend or dist.get_backend()
        options: C10dBackend.Options
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
        else:
            options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = self.timeout
        return backend, options

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
            return mesh["dp_replicate", "dp_shard"] if shape.replicate > 1 else mesh["dp_shard"]
        flat = self._flattened["dp_shard_cp"]
        if shape.replicate == 1:
            return flat
        with warnings.catch_warnings():
            # The flattened mesh is held here; torch warns of slicing one from the
            # root, which is the only public way to pair it with dp_replicate.
            warnings.filterwarnings("ignore", "Slicing a flattened dim", UserWarning)
            return mesh["dp_replicate", "dp_shard_cp"]

    @property
    def context_parallel_group(self) -> dist.ProcessGroup | None:
        """This rank's ``cp`` group, for `context_parallel_attention` (``None``: cp = 1).

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        _ = self.device_mesh
        return self._groups["cp"] if self.mesh_shape.context > 1 else None

    @property
    def pipeline_group(self) -> dist.ProcessGroup | None:
        """This rank's ``pp`` group, over which stages pass activations (``None``: pp = 1).

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        _ = self.device_mesh
        return self._groups["pp"] if self.mesh_shape.pipeline > 1 else None

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
        from plait.strategies.pipeline import Pipeline, split_module  # noqa: PLC0415

        name = schedule_name(schedule) if schedule is not None else self.pipeline_schedule
        per_rank = (
            self.pipeline_stages_per_rank
            if schedule is None and stages_per_rank is None
            else stages_per_rank_of(name, stages_per_rank)
        )
        shape = self.mesh_shape
        rank = shape.coordinates(self.global_rank)["pp"]
        parts, mine, count = split_module(
            module,
            stages=stages,
            units=units,
            schedule=name,
            per_rank=per_rank,
            rank=rank,
            size=shape.pipeline,
        )
        chunks = microbatches if microbatches is not None else self.pipeline_microbatches
        if chunks is not None:
            check_size("microbatches", chunks)
        group = self.pipeline_group
        ranks = shape.lines(["pp"])
        [line] = [row for row in ranks.tolist() if self.global_rank in row]
        return Pipeline(
            parts,
            stages=mine,
            num_stages=count,
            schedule=name,
            microbatches=chunks if chunks is not None else count,
            loss_fn=loss_fn,
            group=group,
            group_ranks=line,
            device=self.root_device,
        )

    def sequence_positions(self, length: int) -> torch.Tensor:
        """The global positions of the tokens this rank holds of a sequence of ``length``.

        All of them (``arange(length)``) without context parallelism; with it, this
        rank's ``cp`` slice (`plait.strategies.context_parallel.sequence_positions`),
        load-balanced as the strategy was asked.

        Raises:
            ConfigurationError: ``length`` does not split evenly over the ``cp`` ranks.
        """
        shape = self.mesh_shape
        return sequence_positions(
            length,
            rank=shape.coordinates(self.global_rank)["cp"],
            size=shape.context,
            load_balanced=self.context_parallel_load_balancing and shape.context > 1,
        )

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
        group = self.context_parallel_group
        positions = (
            None
            if group is None
            else self.sequence_positions(query.shape[-2] * self.mesh_shape.context)
        )
        return context_parallel_attention(
            query, key, value, group=group, positions=positions, is_causal=is_causal
        )

    def shard_sequence(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of ``tensor`` along ``dim`` (all of them without cp).

        Shard inputs and targets alike: the positions taken are
        ``sequence_positions(tensor.shape[dim])``.

        Raises:
            ConfigurationError: ``dim`` is not one of ``tensor``'s, or its length does
                not split evenly over the ``cp`` ranks.
        """
        shape = self.mesh_shape
        return shard_sequence(
            tensor,
            rank=shape.coordinates(self.global_rank)["cp"],
            size=shape.context,
            dim=dim,
            load_balanced=self.context_parallel_load_balancing and shape.context > 1,
        )

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
        parameters = list(module.named_parameters())
        shape = self.mesh_shape
        if not parameters or shape.world_size == shape.pipeline:
            # One rank per stage: each holds its stages whole.
            return
        # Named as its user knows it: the module inside a wrapper (the Trainer's).
        described = type(getattr(module, "module", module)).__name__
        if not any(is_dtensor(p) for _, p in parameters):
            raise ConfigurationError(
                f"ModelParallelStrategy got a {described} that nothing "
                "parallelized: the strategy never guesses a plan, and every rank would "
                "train a whole copy",
                value=described,
                fix="parallelize it over strategy.device_mesh: with the Trainer, in the "
                "module's configure_model (self.device_mesh); in your own loop, before "
                "setup_module (parallelize_module(..., mesh['tp'], plan), then "
                "fully_shard(..., mesh=mesh['dp_shard']))",
            )
        needed = [name for name in ("dp_replicate", "dp_shard", "cp") if shape.sizes[name] > 1]
        unsynced = [
            name for name, p in parameters if not set(needed) <= set(_mesh_dimensions_of(p))
        ]
        shown = ", ".join(unsynced[:3]) + (", ..." if len(unsynced) > 3 else "")
        if unsynced and "cp" in needed:
            raise ConfigurationError(
                f"{len(unsynced)} parameters ({shown}) are not sharded over a mesh that "
                f"includes cp: each of the {shape.context} context-parallel ranks computes "
                "their gradients from its own slice of the sequences, and nothing would "
                "sum them",
                value=unsynced,
                fix="call fully_shard on each block and on the root over "
                "strategy.data_parallel_mesh (dp_shard and cp flattened, 'dp_shard_cp')",
            )
        needed = [name for name in needed if name != "cp"]
        if unsynced:
            raise ConfigurationError(
                f"{len(unsynced)} parameters ({shown}) are not sharded over the mesh's "
                f"data-parallel dimensions {needed}: their gradients would not be averaged "
                f"across the {shape.data_parallel} data-parallel ranks, which would drift apart",
                value=unsynced,
                fix="after parallelize_module, call fully_shard on each block and on the "
                "root over mesh['dp_shard'] (mesh['dp_replicate', 'dp_shard'] with "
                "replicas)",
            )

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
        are 0.
        """
        shape = self.mesh_shape
        if shape.pipeline == 1:
            return super().buffer_sources()
        sources: list[tuple[dist.ProcessGroup | None, int]] = []
        for name in ("dp", "cp", "tp"):
            lines = shape.lines(FLATTENED_DIMENSIONS.get(name, (name,)))
            [line] = [row for row in lines.tolist() if self.global_rank in row]
            if len(line) > 1:
                sources.append((self._groups[name], line[0]))
        return sources

    @override
    def full_module_state(self, module: torch.nn.Module) -> StateDict:
        """The whole state on rank 0's CPU (empty elsewhere); under a pipeline, every stage's.

        Each stage's state is gathered whole within its ranks, then the stages' are
        gathered over ``pp`` to rank 0, keyed by the whole module's names.
        """
        group = self.pipeline_group
        if group is None or not names_parts_as_whole(module):
            return super().full_module_state(module)
        from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
            StateDictOptions,
        )

        # Whole on every rank of the stage (each stage's ranks gather their own).
        state = self._module_state(module, StateDictOptions(full_state_dict=True))
        where = self.mesh_shape.coordinates(self.global_rank)
        first = all(where[name] == 0 for name in ("dp", "cp", "tp"))
        mine = (
            {
                name: value.detach().cpu() if isinstance(value, torch.Tensor) else value
                for name, value in state.items()
            }
            if first
            else {}
        )
        stages: list[StateDict | None] = [None] * self.mesh_shape.pipeline
        dist.all_gather_object(stages, mine, group=group)
        if not self.is_global_zero:
            return {}
        whole: dict[str, object] = {}
        for part in stages:
            whole.update(part or {})
        return whole

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
        group = self.pipeline_group
        if group is None or not names_parts_as_whole(module):
            return state
        groups = state.get("param_groups")
        assert isinstance(groups, list)
        mine = [list(entry["params"]) for entry in groups]
        everyone: list[list[list[str]] | None] = [None] * self.mesh_shape.pipeline
        dist.all_gather_object(everyone, mine, group=group)
        return {
            **state,
            "param_groups": [
                {**entry, "params": list(dict.fromkeys(
                    name for ranks in everyone if ranks is not None for name in ranks[index]
                ))}
                for index, entry in enumerate(groups)
            ],
        }  # fmt: skip

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
        if self.mesh_shape.pipeline == 1 or algorithm != "norm":
            return super().clip_gradients(module, optimizer, clip_val, algorithm)
        parameters = [
            parameter
            for group in optimizer.param_groups
            for parameter in group["params"]
            if parameter.grad is not None
        ]
        norms = [_whole_norm(torch.linalg.vector_norm(p.grad)) for p in parameters]
        squared = (
            torch.stack(norms).square().sum() if norms else torch.zeros((), device=self.root_device)
        )
        dist.all_reduce(squared, group=self.pipeline_group)
        total = squared.sqrt()
        torch.nn.utils.clip_grads_with_norm_(parameters, clip_val, total)
        return total

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


def _whole_norm(norm: torch.Tensor) -> torch.Tensor:
    # A DTensor gradient's norm is a DTensor (partial or replicated): its whole value.
    full = getattr(norm, "full_tensor", None)
    value: torch.Tensor = full() if callable(full) else norm
    return value


def _mesh_dimensions_of(parameter: torch.Tensor) -> tuple[str, ...]:
    # The named dimensions a DTensor parameter is laid out over (none for a tensor),
    # a flattened one as the dimensions it flattens.
    if not is_dtensor(parameter):
        return ()
    names = getattr(getattr(parameter, "device_mesh", None), "mesh_dim_names", None)
    return tuple(
        dimension for name in names or () for dimension in FLATTENED_DIMENSIONS.get(name, (name,))
    )
