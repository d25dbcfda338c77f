"""Loading a module's state with errors that name what does not fit."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from plait.core import CheckpointError

__all__ = ["check_state_fits", "load_module_state"]


def load_module_state(module: torch.nn.Module, state: Mapping[str, object], source: object) -> None:
    """Load ``state`` into ``module``, or say which entries do not fit and how.

    Raises:
        CheckpointError: Keys are missing or unexpected, or shapes differ; each is
            named (``source`` is the checkpoint's path, for the message).
    """
    check_state_fits(module.state_dict(), state, source)
    module.load_state_dict(state)


def check_state_fits(
    own: Mapping[str, object], state: Mapping[str, object], source: object
) -> None:
    """Say which entries of ``state`` do not fit a module whose state is ``own``.

    Shapes are compared whole (a sharded tensor's shape is its global one).

    Raises:
        CheckpointError: Keys are missing or unexpected, or shapes differ; each is
            named (``source`` is the checkpoint's path, for the message).
    """
    problems = []
    for key, value in state.items():
        mine = own.get(key)
        if (
            isinstance(value, torch.Tensor)
            and isinstance(mine, torch.Tensor)
            and mine.shape != value.shape
        ):
            problems.append(
                f"{key!r} has shape {tuple(value.shape)} in the checkpoint and "
                f"{tuple(mine.shape)} in the model"
            )
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing:
        problems.append(f"the model's {', '.join(map(repr, missing[:5]))} are not in it")
    if unexpected:
        problems.append(f"it holds {', '.join(map(repr, unexpected[:5]))}, which the model lacks")
    if problems:
        raise CheckpointError(
            str(source),
            "does not fit the model: " + "; ".join(problems),
            fix="build the model with the configuration the checkpoint was saved with, or "
            "load a checkpoint of this model",
        )
