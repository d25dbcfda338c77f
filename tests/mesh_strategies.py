"""Strategies built on a given mesh, for the conformance suite's mesh lanes.

The suite calls a mesh lane's factory with ``mesh_shape``, the sizes of the mesh's
dimensions (`plait.conformance.ConformanceSuite.meshes`); these build
`ModelParallelStrategy` from them: ``(data parallel, tensor parallel)``.
"""

from __future__ import annotations

from plait.core import ConfigurationError
from plait.strategies import ModelParallelStrategy


def model_parallel_on(mesh_shape: tuple[int, ...]) -> ModelParallelStrategy:
    """`ModelParallelStrategy` on the CPU over a (data parallel, tensor parallel) mesh."""
    if len(mesh_shape) != 2:
        raise ConfigurationError(
            f"mesh_shape={mesh_shape} must be (data parallel, tensor parallel)",
            value=mesh_shape,
            fix="pass mesh_shape=(2, 2), say",
        )
    data, tensor = mesh_shape
    return ModelParallelStrategy(
        accelerator="cpu", data_parallel_size=data, tensor_parallel_size=tensor
    )
