"""Optimizers made before the module moved to a device that replaced its parameters (XLA)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

__all__ = ["rebind_optimizers", "replaced_parameters"]


def replaced_parameters(
    before: list[torch.nn.Parameter], after: list[torch.nn.Parameter]
) -> dict[int, torch.nn.Parameter]:
    """The parameters a move replaced, by the old ones' ids (none where it kept them).

    Moving a module to a device whose tensors cannot share the CPU's storage type
    (XLA) makes new Parameter objects, where CUDA keeps the old ones.
    """
    if len(before) != len(after):
        return {}
    return {id(old): new for old, new in zip(before, after, strict=True) if old is not new}


def rebind_optimizers(
    optimizers: Sequence[torch.optim.Optimizer], moved: Mapping[int, torch.nn.Parameter]
) -> None:
    """Point optimizers made before a move at the parameters it made, with their state.

    They would step the abandoned CPU copies, and training would silently change
    nothing. They are changed in place, so that schedulers bound to them stay bound.
    """
    if not moved:
        return
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            # The list itself is kept, its items replaced: an optimizer may hold it
            # (LBFGS keeps its group's list as its parameters).
            group["params"][:] = [
                moved.get(id(parameter), parameter) for parameter in group["params"]
            ]
        for old_id, new in moved.items():
            old = next((key for key in optimizer.state if id(key) == old_id), None)
            if old is None:
                continue
            # Per-parameter buffers follow the parameter; scalars (a step count) stay
            # on the CPU, where torch's optimizers keep them.
            state = optimizer.state.pop(old)
            optimizer.state[new] = {
                key: value.to(new.device)
                if isinstance(value, torch.Tensor) and value.dim() > 0
                else value
                for key, value in state.items()
            }
