"""Loading a module's state with errors that name what does not fit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from plait.core import CheckpointError

if TYPE_CHECKING:
    from plait.core.typing import StateDict

__all__ = ["check_state_fits", "load_module_state", "module_state_of", "optimizer_states_of"]


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


def module_state_of(state: Mapping[str, object], source: object) -> StateDict:
    """The module's entry of a strategy's state (``"state_dict"``).

    Raises:
        CheckpointError: There is none.
    """
    module_state = state.get("state_dict")
    if not isinstance(module_state, Mapping):
        raise CheckpointError(str(source), "holds no module state ('state_dict')")
    return dict(module_state)


def optimizer_states_of(state: Mapping[str, object], count: int, source: object) -> list[StateDict]:
    """The ``count`` optimizer states of a strategy's state (``"optimizer_states"``).

    Raises:
        CheckpointError: It holds another number of them, or one is not a mapping.
    """
    saved = state.get("optimizer_states")
    saved = list(saved) if isinstance(saved, list | tuple) else []
    if len(saved) != count:
        raise CheckpointError(
            str(source),
            f"holds {len(saved)} optimizer states, and there are {count} optimizers",
            fix="resume with the configuration the checkpoint was written with",
        )
    if not all(isinstance(one, Mapping) for one in saved):
        raise CheckpointError(str(source), "holds an optimizer state that is not a mapping")
    # DCP writes no entry for an empty mapping: an optimizer without per-parameter
    # state (plain SGD) comes back without its "state".
    return [_integer_keys({"state": {}, **one}) for one in saved]


def _integer_keys(optimizer_state: Mapping[str, object]) -> StateDict:
    # torch keys an optimizer's per-parameter state by the integer index its
    # param_groups list. DCP (and torch_xla's planner) write every mapping key as a
    # string, so the state comes back keyed "0", "1", ...: given to load_state_dict
    # so, it would be kept beside the parameters' own state, unused, and training
    # would go on from fresh moments. State keyed by name (FSDP's) is left alone.
    groups = optimizer_state.get("param_groups")
    per_parameter = optimizer_state.get("state")
    indexed = isinstance(groups, list | tuple) and all(
        isinstance(group, Mapping)
        and all(isinstance(index, int) for index in group.get("params", ()))
        for group in groups
    )
    if not indexed or not isinstance(per_parameter, Mapping):
        return dict(optimizer_state)
    restored = {
        int(key) if isinstance(key, str) and key.isdigit() else key: value
        for key, value in per_parameter.items()
    }
    return {**optimizer_state, "state": restored}
