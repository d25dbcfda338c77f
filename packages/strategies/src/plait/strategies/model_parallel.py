"""`ModelParallelStrategy`: data, tensor and sequence parallelism on one named DeviceMesh.

The strategy builds the mesh and never guesses a plan: the user's module parallelizes
itself over it (``parallelize_module`` for tensor and sequence parallelism on
``mesh["tp"]``, then ``fully_shard`` on ``mesh["dp_shard"]``), as a torchtitan
``parallelize`` function does. The module's state then lives as DTensors, saved and
loaded through ``torch.distributed.checkpoint`` by every rank (`MeshStrategy`), so a
checkpoint written on one mesh shape loads on another.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Final, Literal

import attrs
import torch
import torch.distributed as dist
from typing_extensions import override

from plait.core import ConfigurationError, ProcessLayout
from plait.strategies import meta
from plait.strategies.mesh import MeshStrategy, is_dtensor
from plait.strategies.parallel import DEFAULT_START_TIMEOUT, DEFAULT_TIMEOUT, process_group_options
from plait.strategies.self_launching import check_start_method

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from plait.core import Accelerator, CheckpointIO, ClusterEnvironment, Collectives, Precision
    from plait.strategies.collectives import DistributedCollectives

__all__ = ["MESH_DIMENSIONS", "MeshShape", "ModelParallelStrategy"]

MESH_DIMENSIONS: Final = ("dp_replicate", "dp_shard", "tp")
"""The mesh's dimensions, outermost first: data-parallel replicas, data-parallel
shards within a replica, and tensor-parallel ranks (innermost: neighbouring ranks,
which share a node's fastest links)."""

Size = int | Literal["auto"]


def _check_size(name: str, value: object) -> Size:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ConfigurationError(
        f"{name}={value!r} is neither a positive int nor 'auto'",
        value=value,
        fix=f"pass {name}=2 (say), or 'auto' to take what the world leaves",
    )


@attrs.frozen
class MeshShape:
    """The sizes of the mesh's dimensions, and this rank's place along each.

    Ranks are laid out row-major over (``dp_replicate``, ``dp_shard``, ``tp``): the
    ranks of one tensor-parallel group are neighbours.

    Attributes:
        replicate: Data-parallel replicas (``dp_replicate``).
        shard: Data-parallel shards within a replica (``dp_shard``).
        tensor: Tensor-parallel ranks (``tp``).
    """

    replicate: int
    shard: int
    tensor: int

    @property
    def data_parallel(self) -> int:
        """The distinct shards of the data: replicas times shards."""
        return self.replicate * self.shard

    @property
    def world_size(self) -> int:
        """The ranks the mesh holds."""
        return self.data_parallel * self.tensor

    def ranks(self) -> torch.Tensor:
        """The global ranks, shaped (``dp_replicate``, ``dp_shard``, ``tp``)."""
        return torch.arange(self.world_size).view(self.replicate, self.shard, self.tensor)

    def coordinates(self, rank: int) -> dict[str, int]:
        """``rank``'s index along each dimension, and along the flattened ``dp``."""
        data_parallel, tensor = divmod(rank, self.tensor)
        replicate, shard = divmod(data_parallel, self.shard)
        return {"dp_replicate": replicate, "dp_shard": shard, "tp": tensor, "dp": data_parallel}


class ModelParallelStrategy(MeshStrategy):
    """Tensor, sequence and data parallelism on one `DeviceMesh`, as torchtitan trains.

    The strategy joins the process group and builds a named mesh of
    ``(dp_replicate, dp_shard, tp)`` (`MESH_DIMENSIONS`): `device_mesh`. The module
    parallelizes itself over it: under the Trainer in ``configure_model`` (reading
    ``self.device_mesh``), in a loop of your own before `setup_module`; typically
    ``parallelize_module(block, mesh["tp"], plan)`` per block, then ``fully_shard``
    per block and on the root over ``mesh["dp_shard"]`` (``mesh["dp_replicate",
    "dp_shard"]`` for hybrid sharding). A context or pipeline dimension would join
    the mesh the same way, as another named dimension between ``dp_shard`` and
    ``tp``.

    Data is sharded by the data-parallel coordinates (`layout`): the ranks of one
    tensor-parallel group read the same batches. Collectives take ``group="dp"``,
    ``"tp"``, ``"dp_shard"``, ``"dp_replicate"`` (or ``"data_parallel"``, the name
    every strategy knows) to run within this rank's group along that dimension.
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
        checkpoint_io: The checkpoint IO, or its name; ``"distributed"`` (the
            default): every rank writes its shards.
        start_method: How the ranks are started when no scheduler did.

    Raises:
        ConfigurationError: A size that is neither a positive int nor ``"auto"``, a
            replica count that does not divide the data-parallel size, or a
            checkpoint IO that writes on rank 0 alone.
    """

    def __init__(
        self,
        *,
        data_parallel_size: Size = "auto",
        tensor_parallel_size: Size = "auto",
        data_parallel_replicate_size: int = 1,
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
        self.data_parallel_size = _check_size("data_parallel_size", data_parallel_size)
        self.tensor_parallel_size = _check_size("tensor_parallel_size", tensor_parallel_size)
        replicate = _check_size("data_parallel_replicate_size", data_parallel_replicate_size)
        if replicate == "auto":
            raise ConfigurationError(
                "data_parallel_replicate_size takes a positive int, not 'auto'",
                value=replicate,
                fix="pass data_parallel_replicate_size=1 (pure sharding), or the replicas",
            )
        if isinstance(self.data_parallel_size, int) and self.data_parallel_size % replicate:
            raise ConfigurationError(
                f"data_parallel_replicate_size={replicate} does not divide "
                f"data_parallel_size={self.data_parallel_size}: each replica is sharded "
                "over as many ranks as the others",
                value=replicate,
                fix="pass a replica count that divides data_parallel_size",
            )
        self.data_parallel_replicate_size = replicate
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
        """The mesh's sizes, resolved against the job's world size.

        Raises:
            ConfigurationError: The sizes given do not make the world size.
        """
        world = self.world_size
        data, tensor = self.data_parallel_size, self.tensor_parallel_size
        if data == "auto" and tensor == "auto":
            nodes = self.num_nodes
            data = nodes if world % nodes == 0 else 1
        if tensor == "auto":
            assert isinstance(data, int)
            tensor = self._leaves("tensor_parallel_size", "data_parallel_size", data, world)
        elif data == "auto":
            data = self._leaves("data_parallel_size", "tensor_parallel_size", tensor, world)
        if data * tensor != world:
            raise ConfigurationError(
                f"data_parallel_size={data} x tensor_parallel_size={tensor} is {data * tensor} "
                f"ranks, and the world has {world}",
                value=(data, tensor),
                fix=f"give sizes whose product is {world}, or leave one 'auto'",
            )
        replicate = self.data_parallel_replicate_size
        if data % replicate:
            raise ConfigurationError(
                f"data_parallel_replicate_size={replicate} does not divide the "
                f"data-parallel size {data}",
                value=replicate,
                fix=f"pass a replica count that divides {data}",
            )
        return MeshShape(replicate=replicate, shard=data // replicate, tensor=tensor)

    @staticmethod
    def _leaves(name: str, given_name: str, given: int, world: int) -> int:
        if world % given:
            raise ConfigurationError(
                f"{given_name}={given} does not divide the world of {world} ranks, so "
                f"{name}='auto' has no size to take",
                value=given,
                fix=f"pass a {given_name} that divides {world}",
            )
        return world // given

    @property
    @override
    def layout(self) -> ProcessLayout:
        """The data-parallel rank and size from the mesh, and the ``tp`` coordinate.

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
        return ProcessLayout(
            world_size=self.world_size,
            global_rank=self.global_rank,
            data_parallel_size=shape.data_parallel,
            data_parallel_rank=where["dp"],
            dimensions={"tp": shape.tensor},
            coordinates={"tp": where["tp"]},
        )

    @override
    def make_collectives(self, distributed: DistributedCollectives) -> Collectives:
        """Plait's collectives, with ``group=`` naming the mesh's dimensions."""
        shape = self.mesh_shape
        # One mesh per shape in a job: a module parallelized over it in one run goes
        # on over it in the next, and no run makes groups of its own again.
        self._mesh, groups = self.job_held(
            ("model parallel mesh", shape), lambda: self._make_mesh(shape)
        )
        return distributed.with_dimensions(groups)

    def _make_mesh(
        self, shape: MeshShape
    ) -> tuple[DeviceMesh, dict[str, dist.ProcessGroup | None]]:
        from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

        ranks = shape.ranks()
        # Groups of their own, with the strategy's collective timeout: every rank
        # makes every group, in the same order.
        mine = [self._group_along(ranks, axis) for axis in range(len(MESH_DIMENSIONS))]
        flat = ranks.view(shape.data_parallel, shape.tensor)
        data_parallel = self.subgroup(flat.T)
        mesh = DeviceMesh.from_group(
            mine, self.root_device.type, mesh=ranks, mesh_dim_names=MESH_DIMENSIONS
        )
        groups: dict[str, dist.ProcessGroup | None] = dict(zip(MESH_DIMENSIONS, mine, strict=True))
        groups["dp"] = groups["data_parallel"] = (
            None if shape.data_parallel == shape.world_size else data_parallel
        )
        return mesh, groups

    def _group_along(self, ranks: torch.Tensor, axis: int) -> dist.ProcessGroup:
        # Every line of ranks along ``axis``: this rank's is returned.
        return self.subgroup(ranks.movedim(axis, -1).reshape(-1, ranks.shape[axis]))

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
        if not parameters or self.world_size == 1:
            return
        shape = self.mesh_shape
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
        needed = [
            name
            for name, size in (("dp_replicate", shape.replicate), ("dp_shard", shape.shard))
            if size > 1
        ]
        unsynced = [
            name for name, p in parameters if not set(needed) <= set(_mesh_dimensions_of(p))
        ]
        if unsynced:
            shown = ", ".join(unsynced[:3]) + (", ..." if len(unsynced) > 3 else "")
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
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(data_parallel_size={self.data_parallel_size!r}, "
            f"tensor_parallel_size={self.tensor_parallel_size!r}, "
            f"data_parallel_replicate_size={self.data_parallel_replicate_size}, "
            f"world_size={self.world_size}, device={str(self.root_device)!r})"
        )


def _mesh_dimensions_of(parameter: torch.Tensor) -> tuple[str, ...]:
    # The named dimensions a DTensor parameter is laid out over (none for a tensor).
    if not is_dtensor(parameter):
        return ()
    names = getattr(getattr(parameter, "device_mesh", None), "mesh_dim_names", None)
    return tuple(names or ())
