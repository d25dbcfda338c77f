"""Strategies built on a given mesh, for the conformance suite's mesh lanes.

The suite calls a mesh lane's factory with ``mesh_shape``, the sizes of the mesh's
dimensions (`plait.conformance.ConformanceSuite.meshes`); these build
`ModelParallelStrategy` from them: ``(data parallel, tensor parallel)``, or
``(pipeline, data parallel, context parallel, tensor parallel)``.
"""

from __future__ import annotations

from plait.core import ConfigurationError
from plait.strategies import ModelParallelStrategy


def model_parallel_on(mesh_shape: tuple[int, ...] | None = None) -> ModelParallelStrategy:
    """`ModelParallelStrategy` on the CPU over a (dp, tp) or (pp, dp, cp, tp) mesh.

    Without a shape, on the mesh it chooses (the training kit resizes a checkpoint
    to it).
    """
    if mesh_shape is None:
        return ModelParallelStrategy(accelerator="cpu")
    if len(mesh_shape) == 2:
        pipeline, (data, tensor), context = 1, mesh_shape, 1
    elif len(mesh_shape) == 4:
        pipeline, data, context, tensor = mesh_shape
    else:
        raise ConfigurationError(
            f"mesh_shape={mesh_shape} must be (data parallel, tensor parallel) or "
            "(pipeline, data parallel, context parallel, tensor parallel)",
            value=mesh_shape,
            fix="pass mesh_shape=(2, 2) or (2, 1, 2, 1), say",
        )
    return ModelParallelStrategy(
        accelerator="cpu",
        data_parallel_size=data,
        tensor_parallel_size=tensor,
        context_parallel_size=context,
        pipeline_parallel_size=pipeline,
    )
