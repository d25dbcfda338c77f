"""The device mesh of a `MeshShape`, and its groups, made over a job's process group.

`build_mesh` makes one group per dimension of the mesh plan and one for ``dp``
(through the strategy's ``subgroup``, so each takes the strategy's collective
timeout), the named `DeviceMesh` over those, and with context parallelism the
flattened meshes FSDP shards over (``dp_shard_cp``, ``dp_cp``). Every rank makes
every group in the same order; a strategy keeps what it gives for its job's life.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from plait.strategies.mesh_plan import FLATTENED_DIMENSIONS, MESH_DIMENSIONS, MeshDim, MeshShape

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Backend as C10dBackend
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["MeshGroups", "build_mesh"]

MeshGroups = tuple["DeviceMesh", dict[str, dist.ProcessGroup | None], dict[str, "DeviceMesh"]]
"""The mesh, each dimension's (and flattened group's) group by name, the flattened meshes."""


def build_mesh(
    shape: MeshShape,
    subgroup: Callable[[torch.Tensor], dist.ProcessGroup],
    *,
    device_type: str,
    backend: str,
    timeout: timedelta,
) -> MeshGroups:
    """The mesh of ``shape`` on ``device_type``, its groups, and its flattened meshes.

    Args:
        shape: The mesh, resolved against the job.
        subgroup: Makes the group of each row of ranks it is given (every rank
            calls it with every row), with the strategy's timeout.
        device_type: The mesh's device type (``"cpu"``, ``"cuda"``).
        backend: The process group's backend: the flattened meshes' groups, which
            torch makes, take ``timeout`` through its options.
        timeout: The strategy's collective timeout.
    """
    from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

    mine = [subgroup(shape.lines([name])) for name in MESH_DIMENSIONS]
    data_parallel = subgroup(shape.lines(FLATTENED_DIMENSIONS[MeshDim.DATA]))
    along = dict(zip(MESH_DIMENSIONS, mine, strict=True))
    names = shape.mesh_dimensions
    mesh = DeviceMesh.from_group(
        [along[name] for name in names],
        device_type,
        mesh=shape.ranks().view(*(shape.sizes[name] for name in names)),
        mesh_dim_names=tuple(name.value for name in names),
    )
    groups: dict[str, dist.ProcessGroup | None] = {}
    groups.update(along.items())
    whole = shape.data_parallel == shape.world_size
    groups[MeshDim.DATA] = groups["data_parallel"] = None if whole else data_parallel
    flattened: dict[str, DeviceMesh] = {}
    if shape.context == 1:
        # Without context parallelism these are the groups the mesh has already.
        groups[MeshDim.SHARD_CONTEXT] = groups[MeshDim.SHARD]
        groups[MeshDim.DATA_CONTEXT] = groups[MeshDim.DATA]
        return mesh, groups, flattened
    for name in (MeshDim.SHARD_CONTEXT, MeshDim.DATA_CONTEXT):
        # A flattened mesh is what FSDP shards over; its group, made by torch,
        # takes the strategy's timeout through the backend's options.
        flattened[name] = mesh[tuple(d.value for d in FLATTENED_DIMENSIONS[name])]._flatten(
            name.value, backend_override=_backend_options(backend, timeout)
        )
        groups[name] = flattened[name].get_group()
    return mesh, groups, flattened


def _backend_options(backend: str, timeout: timedelta) -> tuple[str, C10dBackend.Options]:
    options: C10dBackend.Options
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
    else:
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = timeout
    return backend, options
