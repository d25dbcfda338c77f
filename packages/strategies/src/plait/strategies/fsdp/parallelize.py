"""Fully sharded data parallelism as ordered functions over a module.

`FSDPStrategy` applies them in this order, each on what the previous one left:

1. `apply_activation_checkpointing`: the chosen blocks recompute their forward in
   backward instead of keeping activations;
2. `apply_fully_shard`: the chosen blocks, innermost first, then the root, are sharded
   with FSDP2's ``fully_shard`` (each block is one all-gather in forward and one
   reduce-scatter in backward);
3. `set_backward_prefetch`: blocks ask for the next blocks' parameters ahead of time;
4. `materialize`: a model built on the meta device gets its memory (this rank's shards
   only) and its initial values (`plait.strategies.meta`, which every strategy that
   builds models on the meta device shares).

Each may be used on its own, in a loop of your own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from plait.strategies.fsdp.options import ModulePolicy, SizeBasedPolicy
from plait.strategies.meta import check_materializable, is_meta, materialize
from plait.strategies.norms import BATCH_NORMS

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, OffloadPolicy

__all__ = [
    "apply_activation_checkpointing",
    "apply_fully_shard",
    "cast_buffers",
    "check_materializable",
    "is_meta",
    "materialize",
    "set_backward_prefetch",
]

_CHECKPOINTED = "_plait_activation_checkpointed"


def _post_order(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def _checkpointed(forward: Callable[..., object]) -> Callable[..., object]:
    from torch.utils.checkpoint import checkpoint  # noqa: PLC0415

    @functools.wraps(forward)
    def run(*args: object, **kwargs: object) -> object:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)  # nothing to keep for a backward
        return checkpoint(functools.partial(forward, **kwargs), *args, use_reentrant=False)

    return run


def apply_activation_checkpointing(
    module: torch.nn.Module, policy: ModulePolicy
) -> list[torch.nn.Module]:
    """Make each submodule ``policy`` chooses recompute its forward during backward.

    The module keeps its class, its parameters' names and its state dict: its
    ``forward`` runs under ``torch.utils.checkpoint.checkpoint`` (non-reentrant), which
    keeps only its inputs and runs it again when backward needs its activations.
    Under ``torch.no_grad()`` it runs plainly.

    Returns:
        The chosen submodules.
    """
    chosen = [m for m in module.modules() if policy(m) and not getattr(m, _CHECKPOINTED, False)]
    for block in chosen:
        block.forward = _checkpointed(block.forward)
        setattr(block, _CHECKPOINTED, True)
    return chosen


def _blocks(
    root: torch.nn.Module, policy: ModulePolicy | SizeBasedPolicy | None
) -> list[torch.nn.Module]:
    # Innermost first: FSDP2 shards a block's own parameters, those its sharded
    # children do not hold.
    if policy is None:
        return []
    if not isinstance(policy, SizeBasedPolicy):
        return [m for m in _post_order(root) if m is not root and policy(m)]
    chosen: list[torch.nn.Module] = []

    def uncovered(module: torch.nn.Module) -> int:
        count = sum(p.numel() for p in module.parameters(recurse=False))
        count += sum(uncovered(child) for child in module.children())
        if module is not root and count >= policy.min_num_params:
            chosen.append(module)
            return 0
        return count

    uncovered(root)
    return chosen


def apply_fully_shard(
    module: torch.nn.Module,
    *,
    mesh: DeviceMesh,
    policy: ModulePolicy | SizeBasedPolicy | None,
    reshard_after_forward: bool,
    mp_policy: MixedPrecisionPolicy,
    offload_policy: OffloadPolicy | None,
    options: Mapping[str, object] | None = None,
) -> list[FSDPModule]:
    """Shard each block ``policy`` chooses (innermost first), then ``module`` itself.

    Args:
        module: The root; sharded last, so that it holds every parameter no block does.
        mesh: A 1-D mesh (shard across it), or 2-D (replicate across the first
            dimension, shard across the second).
        policy: Which submodules are blocks; none (the root alone) by default.
        reshard_after_forward: Free each block's gathered parameters after forward.
            The root keeps FSDP2's heuristic (its parameters are needed again at once).
        mp_policy: Parameter, gradient-reduction and output dtypes.
        offload_policy: Where parameters, gradients and optimizer state live
            between uses (``CPUOffloadPolicy``), or on the device.
        options: More keyword arguments of ``fully_shard``.

    Under a lower-precision ``mp_policy``, each batch normalization layer is sharded
    on its own and computes in float32, as its running statistics are kept: its
    input is cast up and its output back to the parameters' dtype.

    Returns:
        The sharded blocks in forward order (the root not among them).
    """
    from torch.distributed.fsdp import (  # noqa: PLC0415
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    common: dict[str, object] = {
        "mesh": mesh,
        "mp_policy": mp_policy,
        "offload_policy": offload_policy or OffloadPolicy(),
        **(options or {}),
    }
    # Given among the options, it overrides the sharding strategy's, for the blocks.
    reshard = common.pop("reshard_after_forward", reshard_after_forward)
    blocks = _blocks(module, policy)
    lower = mp_policy.param_dtype not in (None, torch.float32)
    norms = [
        norm
        for norm in module.modules()
        if lower and isinstance(norm, BATCH_NORMS) and norm is not module and norm not in blocks
    ]
    kept = MixedPrecisionPolicy(
        param_dtype=torch.float32,
        reduce_dtype=mp_policy.reduce_dtype,
        output_dtype=mp_policy.param_dtype,
        cast_forward_inputs=True,
    )
    for norm in norms:
        fully_shard(norm, reshard_after_forward=reshard, **{**common, "mp_policy": kept})  # type: ignore[call-overload]
    for block in blocks:
        fully_shard(block, reshard_after_forward=reshard, **common)  # type: ignore[call-overload]
    root_reshard = None if reshard is True else False
    fully_shard(module, reshard_after_forward=root_reshard, **common)  # type: ignore[call-overload]
    forward_order = {id(m): index for index, m in enumerate(module.modules())}
    ordered = sorted(blocks, key=lambda block: forward_order[id(block)])
    return [block for block in ordered if isinstance(block, FSDPModule)]


def set_backward_prefetch(blocks: Sequence[FSDPModule], depth: int) -> None:
    """Have each block, in backward, gather the parameters of the ``depth`` blocks after it.

    ``blocks`` are in forward order; backward runs them in reverse.
    """
    backward = list(reversed(blocks))
    for index, block in enumerate(backward):
        following = backward[index + 1 : index + 1 + depth]
        if following:
            block.set_modules_to_backward_prefetch(following)


def cast_buffers(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast ``module``'s floating-point buffers to ``dtype`` (FSDP2 leaves buffers as they are)."""
    for submodule in module.modules():
        for name, buffer in list(submodule.named_buffers(recurse=False)):
            if buffer.is_floating_point():
                setattr(submodule, name, buffer.to(dtype))
