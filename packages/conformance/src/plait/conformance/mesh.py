"""A strategy's device mesh as plain data: its dimensions and the groups along each.

The suite runs every property over each dimension's groups as well as over the
world (`plait.conformance.ConformanceSuite.meshes`): every group of the dimension
runs the example at once, its ranks numbered by their place in the group.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs

from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.core import Strategy

__all__ = ["MeshLayout", "mesh_text"]


def mesh_text(mesh: tuple[int, ...]) -> str:
    """``2x2``: a mesh's sizes as lane ids, options and messages write them."""
    return "x".join(map(str, mesh))


@attrs.frozen
class MeshLayout:
    """The dimensions of a device mesh and which global rank sits at each coordinate.

    Attributes:
        names: The dimensions' names, outermost first (``mesh_dim_names``).
        shape: Their sizes.
        ranks: The global ranks in row-major order of the coordinates.
    """

    names: tuple[str, ...]
    shape: tuple[int, ...]
    ranks: tuple[int, ...]

    @classmethod
    def of(cls, strategy: Strategy, mesh_shape: tuple[int, ...]) -> MeshLayout:
        """The layout of ``strategy``'s ``device_mesh``, built for ``mesh_shape``.

        Raises:
            ConfigurationError: The strategy has no ``device_mesh``, its dimensions
                have no names, or it does not hold every rank once.
        """
        mesh = getattr(strategy, "device_mesh", None)
        if mesh is None:
            raise ConfigurationError(
                f"the factory was given mesh_shape={mesh_shape}, but the "
                f"{type(strategy).__name__} it built has no device_mesh",
                value=mesh_shape,
                fix="give the strategy a device_mesh property (plait.core.SupportsDeviceMesh), "
                "or test it without meshes",
            )
        names = mesh.mesh_dim_names
        if not names:
            raise ConfigurationError(
                f"the device mesh of {type(strategy).__name__} (shape {tuple(mesh.shape)}) "
                "has no dimension names: the collectives' group= names a dimension",
                fix="build it with mesh_dim_names=(...), as init_device_mesh takes them",
            )
        layout = cls(tuple(names), tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist()))
        world_size = strategy.world_size
        if sorted(layout.ranks) != list(range(world_size)):
            raise ConfigurationError(
                f"the device mesh of {type(strategy).__name__} holds the ranks "
                f"{list(layout.ranks)}, not each of the {world_size} ranks of the job once",
                value=mesh_shape,
                fix=f"build a mesh of {world_size} ranks for mesh_shape={mesh_shape}",
            )
        return layout

    def groups(self, name: str) -> tuple[tuple[int, ...], ...]:
        """The groups along dimension ``name``, in the order of the other coordinates.

        Each group is the global ranks that differ only in that coordinate, in its order.

        Raises:
            ConfigurationError: The mesh has no dimension ``name``.
        """
        if name not in self.names:
            raise ConfigurationError.invalid_choice("dimension", name, self.names)
        axis = self.names.index(name)
        size = self.shape[axis]
        inner = math.prod(self.shape[axis + 1 :])
        outer = math.prod(self.shape[:axis])
        return tuple(
            tuple(self.ranks[(o * size + place) * inner + i] for place in range(size))
            for o in range(outer)
            for i in range(inner)
        )

    def group_of(self, name: str, rank: int) -> tuple[int, ...]:
        """The group along ``name`` that global rank ``rank`` belongs to."""
        return next(group for group in self.groups(name) if rank in group)

    def describe(self) -> str:
        """``dp_shard=2 x tp=2``: the dimensions and their sizes."""
        return " x ".join(
            f"{name}={size}" for name, size in zip(self.names, self.shape, strict=True)
        )
