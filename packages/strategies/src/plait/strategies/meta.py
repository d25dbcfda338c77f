"""Models built on the meta device: found, checked, and given memory and initial values.

A sharding strategy lets a model be built inside its ``model_sharded_context()`` on
the meta device, holding no memory, and gives each rank only its shards' memory
once the model is sharded. FSDP and the model-parallel mesh both do; these are the
steps they share.
"""

from __future__ import annotations

import warnings

import torch

from plait.core import ConfigurationError

__all__ = ["check_materializable", "is_meta", "materialize"]


def is_meta(module: torch.nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device (no memory yet)."""
    tensors = [*module.parameters(), *module.buffers()]
    return any(tensor.is_meta for tensor in tensors)


def check_materializable(module: torch.nn.Module) -> None:
    """Refuse a meta-device model that `materialize` could not give initial values.

    Raises:
        ConfigurationError: Some submodule holds meta tensors of its own and has no
            ``reset_parameters()``; each such tensor is named.
    """
    lacking = [
        f"{prefix + '.' if prefix else ''}{name}"
        for prefix, submodule in module.named_modules()
        if not callable(getattr(submodule, "reset_parameters", None))
        for name, tensor in [
            *submodule.named_parameters(recurse=False),
            *submodule.named_buffers(recurse=False),
        ]
        if tensor.is_meta
    ]
    if lacking:
        raise ConfigurationError(
            "the model was built on the meta device, and nothing can give initial values "
            f"to {', '.join(lacking[:5])}{' ...' if len(lacking) > 5 else ''}: their modules "
            "have no reset_parameters()",
            value=lacking,
            fix="define reset_parameters() on those modules (initialising their own "
            "parameters and buffers), or build them outside model_sharded_context()",
        )


def materialize(module: torch.nn.Module, device: torch.device) -> None:
    """Give a sharded meta-device model this rank's memory on ``device``, and initial values.

    Each submodule's ``reset_parameters()`` initialises its own tensors (on sharded
    parameters, each rank fills only its shard). Every rank must call it, with the
    same random state.
    """
    check_materializable(module)
    module.to_empty(device=device)
    with torch.no_grad(), warnings.catch_warnings():
        # Each rank fills its own shard from its own generator, which is all torch's
        # notice about random DTensor operators on a CPU mesh warns of.
        warnings.filterwarnings("ignore", message="DTensor random operators may not")
        for submodule in module.modules():
            reset = getattr(submodule, "reset_parameters", None)
            if callable(reset):
                reset()
