"""Whole states into ZeRO's partitions: weights and optimizer state from any strategy.

A DeepSpeed engine with an optimizer keeps the fp32 weights twice: in the module
(at stage 3, each rank its partition) and in the optimizer's flat fp32 copy, which
each step writes back into the module. A whole state (another strategy's checkpoint,
or DeepSpeed's of another stage or world size, rebuilt) is loaded into both, and the
optimizer's per-element state (Adam's moments) into the partitions beside that copy,
each rank taking its own part, through DeepSpeed's tensor-fragment API.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, cast

import torch

from plait.core import CheckpointError
from plait.strategies.deepspeed import library
from plait.strategies.state import load_param_groups

__all__ = ["is_partitioned", "set_master_weights", "set_optimizer_state"]


class _Fragments(Protocol):
    """DeepSpeed's ``deepspeed.utils`` setters of a parameter's fp32 copy and state."""

    def safe_set_full_fp32_param(self, param: torch.Tensor, value: torch.Tensor) -> None: ...
    def safe_set_full_optimizer_state(
        self, param: torch.Tensor, value: torch.Tensor, optim_state_key: str
    ) -> None: ...
    def safe_set_local_fp32_param(self, param: torch.Tensor, value: torch.Tensor) -> None: ...
    def safe_set_local_optimizer_state(
        self, param: torch.Tensor, value: torch.Tensor, optim_state_key: str
    ) -> None: ...


def _fragments() -> _Fragments:
    return cast("_Fragments", library.import_submodule("utils"))


def is_partitioned(parameter: torch.Tensor) -> bool:
    """Whether ZeRO keeps an fp32 copy of ``parameter`` apart from it (stages 1-3, bf16)."""
    return hasattr(parameter, "ds_id") or hasattr(parameter, "_hp_mapping")


def _numel(parameter: torch.Tensor) -> int:
    # A stage-3 parameter is empty between uses; ds_numel is its whole size.
    return int(getattr(parameter, "ds_numel", parameter.numel()))


def _set(
    parameter: torch.Tensor, value: torch.Tensor, key: str | None, rank: int, world_size: int
) -> None:
    fragments = _fragments()
    value = value.detach().to(torch.float32).reshape(-1)
    if hasattr(parameter, "ds_id"):
        # Stage 3: this rank's share of the parameter, padded at the end as ZeRO pads
        # it (DeepSpeed's own full setter reads past the end of a padded parameter).
        share = math.ceil(value.numel() / world_size)
        padded = torch.nn.functional.pad(value, (0, share * world_size - value.numel()))
        part = padded.narrow(0, share * rank, share)
        if key is None:
            fragments.safe_set_local_fp32_param(parameter, part)
        else:
            fragments.safe_set_local_optimizer_state(parameter, part, key)
    elif key is None:
        fragments.safe_set_full_fp32_param(parameter, value.view(parameter.shape))
    else:
        fragments.safe_set_full_optimizer_state(parameter, value.view(parameter.shape), key)


def set_master_weights(
    module: torch.nn.Module, state: Mapping[str, object], *, rank: int, world_size: int
) -> None:
    """Set the optimizer's fp32 copy of each trainable parameter from the whole ``state``.

    ``state`` is keyed by ``module``'s names (a loaded module state); every rank
    passes it whole and keeps its own part.
    """
    for name, parameter in module.named_parameters():
        value = state.get(name)
        if (
            parameter.requires_grad
            and is_partitioned(parameter)
            and isinstance(value, torch.Tensor)
        ):
            _set(parameter, value, None, rank, world_size)


def set_optimizer_state(
    parameters: Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    flats: Sequence[torch.Tensor],
    state: Mapping[str, object],
    *,
    link: Callable[[], None],
    rank: int,
    world_size: int,
    source: object,
) -> None:
    """Load a whole optimizer state keyed by parameter names into ZeRO's.

    ``parameters`` are the model's, by the names the state is keyed by.

    ``optimizer`` is the base optimizer ZeRO steps over this rank's flat fp32
    tensors, ``flats``. Its state is made first where no step has made it yet (as
    torch's ``load_state_dict`` makes it: per-element entries in the flat tensor's
    size, scalars as saved), then ``link`` ties each parameter to its part of it.
    Per-element entries (a tensor of the parameter's size) go to each rank's part;
    scalars (the step) to every flat tensor; the groups' hyper-parameters (the
    learning rate a scheduler set) to the optimizer's groups, in order.

    Raises:
        CheckpointError: It names a parameter the module lacks, holds an entry the
            optimizer does not keep (another kind of optimizer), a value of another
            size, or another number of parameter groups.
    """
    per_parameter = cast("Mapping[str, Mapping[str, object]]", state.get("state", {}))
    unknown = sorted(set(per_parameter) - set(parameters))
    if unknown:
        raise CheckpointError(
            str(source),
            f"holds optimizer state for {', '.join(map(repr, unknown[:5]))}, which the model's "
            "parameters do not include",
            fix="load into the model and optimizer the checkpoint was saved from",
        )
    _make_state(optimizer, flats, per_parameter)
    link()
    scalars: dict[str, list[object]] = {}
    for name, entries in per_parameter.items():
        parameter = parameters[name]
        for key, value in entries.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                scalars.setdefault(key, []).append(value)
                continue
            if value.numel() != _numel(parameter):
                raise CheckpointError(
                    str(source),
                    f"holds an optimizer {key!r} of {value.numel()} elements for {name!r}, "
                    f"which has {_numel(parameter)}",
                    fix="load into the model and optimizer the checkpoint was saved from",
                )
            try:
                _set(parameter, value, key, rank, world_size)
            except (KeyError, ValueError) as error:
                raise CheckpointError(
                    str(source),
                    f"holds the optimizer state {key!r}, which this {type(optimizer).__name__} "
                    f"does not keep ({error})",
                    fix="pass weights_only=True to load_checkpoint to load the weights alone "
                    "(the optimizer starts afresh), or resume with the kind of optimizer the "
                    "checkpoint was saved with",
                ) from error
    _set_scalars(optimizer, flats, scalars)
    load_param_groups(optimizer, state.get("param_groups"), source)


def _make_state(
    optimizer: torch.optim.Optimizer,
    flats: Sequence[torch.Tensor],
    per_parameter: Mapping[str, Mapping[str, object]],
) -> None:
    entries = {key: value for one in per_parameter.values() for key, value in one.items()}
    for flat in flats:
        held = optimizer.state[flat]
        for key, value in entries.items():
            if key in held:
                continue
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                held[key] = torch.zeros_like(flat)
            else:
                held[key] = _scalar(optimizer, value)


def _scalar(optimizer: torch.optim.Optimizer, value: object) -> object:
    # torch's optimizers keep the step as a tensor (and turn a number into one when
    # they load a state); DeepSpeed's own (its CPU Adam, with offloading) as a number.
    if type(optimizer).__module__.startswith("torch.optim"):
        if isinstance(value, torch.Tensor):
            return value.clone()
        return torch.tensor(float(cast("float", value)))
    number = float(value.item()) if isinstance(value, torch.Tensor) else float(cast("float", value))
    return int(number) if number.is_integer() else number


def _set_scalars(
    optimizer: torch.optim.Optimizer,
    flats: Sequence[torch.Tensor],
    scalars: Mapping[str, list[object]],
) -> None:
    for key, values in scalars.items():
        # One value per flat tensor: torch's optimizers step every parameter together.
        highest = max(
            float(v.item()) if isinstance(v, torch.Tensor) else float(cast("float", v))
            for v in values
        )
        for flat in flats:
            held = optimizer.state[flat]
            current = held.get(key)
            if isinstance(current, torch.Tensor):
                held[key] = torch.full_like(current, highest)
            elif current is not None:
                held[key] = type(current)(highest)
