"""From a DeepSpeed checkpoint to whole states: fp32 weights, the optimizer's state.

ZeRO keeps each rank's partition of flat tensors: at stages 1 and 2 a parameter
group's parameters end to end, split evenly between the ranks (the last rank's part
padded); at stage 3 each parameter split evenly on its own (padded to a multiple of
the world size), each rank's parts end to end. The optimizer's per-element state
(Adam's moments) has the layout of those flat fp32 weights, so both are rebuilt the
same way, from the parameters' names and shapes the model-states files record.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, cast

import torch

from plait.core import CheckpointError
from plait.core.checkpoint_dirs import check
from plait.strategies.deepspeed import library
from plait.strategies.deepspeed.layout import (
    PARAMETER_NAMES,
    STAGE3_MODEL_STATES,
    client_entries,
    latest_tag,
)
from plait.strategies.export import write_file

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike, StateDict

__all__ = [
    "checkpoint_layout",
    "consolidate",
    "fp32_state_dict",
    "optimizer_state_dict",
    "read_fp32_state",
    "read_whole",
]

# The Trainer's engine wraps the user's module in a router whose attribute is "module".
_TRAINER_PREFIX: Final = "module."
_WHOLE_MODULE: Final = "mp_rank_00_model_states.pt"


def fp32_state_dict(checkpoint: PathLike, *, tag: str | None = None) -> StateDict:
    """The module's whole state in fp32, rebuilt from a DeepSpeed checkpoint's partitions.

    Runs in one process, without a process group (the checkpoint of any world size);
    the whole state is read into this process's memory. Keys are the user module's
    (a checkpoint the Trainer wrote loses the prefix of its step router).

    Args:
        checkpoint: A checkpoint directory `DeepSpeedStrategy` wrote.
        tag: The tag to read (``latest``'s by default).

    Raises:
        CheckpointError: ``checkpoint`` is not a complete DeepSpeed checkpoint.
    """
    state = read_fp32_state(checkpoint, tag=tag)
    if _routed(state):
        state = {key.removeprefix(_TRAINER_PREFIX): value for key, value in state.items()}
    return state


def _routed(names: Sequence[str] | Mapping[str, object]) -> bool:
    keys = list(names)
    return bool(keys) and all(key.startswith(_TRAINER_PREFIX) for key in keys)


def read_fp32_state(checkpoint: PathLike, *, tag: str | None = None) -> StateDict:
    """The engine's module state in fp32, with the keys the engine's module has.

    Raises:
        CheckpointError: ``checkpoint`` is not a complete DeepSpeed checkpoint.
    """
    zero_to_fp32 = library.import_submodule("utils.zero_to_fp32")
    rebuild: Callable[..., Mapping[str, torch.Tensor]] = (
        zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint
    )

    chosen = tag if tag is not None else verified_latest_tag(checkpoint)
    whole = Path(checkpoint) / chosen / _WHOLE_MODULE
    try:
        if whole.is_file():
            # ZeRO stage 0 partitions nothing: the module's state is whole in one file.
            state = torch.load(whole, map_location="cpu", weights_only=False)["module"]
            assert isinstance(state, Mapping)
        else:
            # It reports its progress on both streams.
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                state = rebuild(os.fspath(checkpoint), tag=chosen)
    except (FileNotFoundError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(
            os.fspath(checkpoint),
            f"cannot be consolidated: {error}",
            fix="pass a complete checkpoint directory written by DeepSpeedStrategy",
        ) from error
    return {key: value.detach().to(torch.float32).contiguous() for key, value in state.items()}


def optimizer_state_dict(checkpoint: PathLike, *, tag: str | None = None) -> StateDict | None:
    """The optimizer's whole state, rebuilt from a DeepSpeed checkpoint's partitions.

    In torch's layout, keyed by the user module's parameter names: ``{"state":
    {name: {"step": ..., "exp_avg": ..., ...}}, "param_groups": [{..., "params":
    [name, ...]}]}``, each per-element tensor in its parameter's shape and in fp32.
    Any strategy loads it (`optimizer_state_keyed` gives it the optimizer's indices).
    Runs in one process, without a process group; ``None`` when the checkpoint holds
    no optimizer state (an engine made without an optimizer wrote it).

    Raises:
        CheckpointError: ``checkpoint`` is not a complete DeepSpeed checkpoint, or its
            optimizer files do not fit its model's shapes.
    """
    folder = _tag_folder(checkpoint, tag)
    return _user_names(_optimizer_state(checkpoint, folder, _model_states(checkpoint, folder)))


def read_whole(
    checkpoint: PathLike, *, tag: str | None = None, optimizer: bool = True
) -> Checkpoint:
    """The whole checkpoint in the layout the other strategies write, in one process.

    The run's entries (what `save_checkpoint` was given beside the module and
    optimizers), ``state_dict`` (`fp32_state_dict`) and, with ``optimizer`` and where
    the checkpoint holds one, ``optimizer_states`` (`optimizer_state_dict`).

    Raises:
        CheckpointError: ``checkpoint`` is not a complete DeepSpeed checkpoint.
    """
    folder = _tag_folder(checkpoint, tag)
    model_states = _model_states(checkpoint, folder)
    whole: Checkpoint = {
        **client_entries(model_states),
        "state_dict": fp32_state_dict(checkpoint, tag=folder.name),
    }
    if optimizer:
        state = _user_names(_optimizer_state(checkpoint, folder, model_states))
        if state is not None:
            whole["optimizer_states"] = [state]
    return whole


def _user_names(state: StateDict | None) -> StateDict | None:
    # A checkpoint the Trainer wrote names its parameters with its router's prefix.
    if state is None:
        return None
    groups = cast("list[dict[str, object]]", state["param_groups"])
    names = [name for group in groups for name in cast("list[str]", group["params"])]
    if not _routed(names):
        return state
    per_parameter = cast("dict[str, object]", state["state"])
    return {
        "state": {key.removeprefix(_TRAINER_PREFIX): value for key, value in per_parameter.items()},
        "param_groups": [
            {
                **group,
                "params": [
                    name.removeprefix(_TRAINER_PREFIX)
                    for name in cast("list[str]", group["params"])
                ],
            }
            for group in groups
        ],
    }


def checkpoint_layout(checkpoint: PathLike, *, tag: str | None = None) -> tuple[int, int]:
    """The ZeRO stage and the data-parallel world size a DeepSpeed checkpoint was saved at.

    Raises:
        CheckpointError: ``checkpoint`` is not a complete DeepSpeed checkpoint.
    """
    folder = _tag_folder(checkpoint, tag)
    saved = _model_states(checkpoint, folder)
    config = saved.get("ds_config")
    zero = config.get("zero_optimization") if isinstance(config, Mapping) else None
    stage = int(zero.get("stage", 0)) if isinstance(zero, Mapping) else 0
    world_size = saved.get("dp_world_size")
    if not isinstance(world_size, int):
        world_size = len(list(folder.glob("*_optim_states.pt"))) or 1
    return stage, world_size


def _optimizer_state(
    checkpoint: PathLike, folder: Path, model_states: Mapping[str, object]
) -> StateDict | None:
    # `optimizer_state_dict`, with the parameter names of the engine's module.
    shapes = model_states.get("param_shapes")
    files = sorted(folder.glob("*_optim_states.pt"), key=_rank_of)
    if not files or not isinstance(shapes, list):
        # Stage 0: the engine saves a torch optimizer's state in the model-states file.
        return _stage0_optimizer_state(model_states)
    saved = [_mapping(_load(file, checkpoint), "optimizer_state_dict", file) for file in files]
    stage = int(cast("int", saved[0]["zero_stage"]))
    base_key, flat_key = (
        ("optimizer_state_dict", "fp32_flat_groups")
        if stage == 3
        else ("base_optimizer_state", "single_partition_of_fp32_groups")
    )
    base = [one[base_key] for one in saved]
    flat = [list(cast("list[torch.Tensor]", one[flat_key])) for one in saved]
    if not all(isinstance(one, Mapping) for one in base):
        raise CheckpointError(
            os.fspath(checkpoint),
            "holds its optimizer state in DeepSpeed's elastic layout, which is not rebuilt",
            fix="save with zero_optimization.elastic_checkpoint off (DeepSpeed's default)",
        )
    bases = cast("list[Mapping[str, object]]", base)
    try:
        return _rebuild(stage, shapes, bases, flat, saved[0].get("param_alignment_paddings"))
    except (KeyError, IndexError, RuntimeError, ValueError) as error:
        raise CheckpointError(
            os.fspath(checkpoint),
            f"has optimizer files that do not fit its parameters' shapes: {error}",
            fix="pass a complete checkpoint directory written by DeepSpeedStrategy",
        ) from error


def verified_latest_tag(checkpoint: PathLike) -> str:
    """The tag ``latest`` names, once every file of the checkpoint matches its checksum.

    Read in one process: all the files are read once (a tag given by the caller is
    read as it is, unchecked).

    Raises:
        CheckpointError: The checkpoint is incomplete, or a file is changed, truncated
            or missing (named).
    """
    tag = latest_tag(checkpoint)
    check(checkpoint, collective=False)
    return tag


def _rank_of(file: Path) -> int:
    # zero_pp_rank_{rank}_mp_rank_00_optim_states.pt (bf16_ in front at stage 0).
    return int(file.name.split("zero_pp_rank_")[1].split("_")[0])


def _tag_folder(checkpoint: PathLike, tag: str | None) -> Path:
    return Path(checkpoint) / (tag if tag is not None else verified_latest_tag(checkpoint))


def _model_states(checkpoint: PathLike, folder: Path) -> dict[str, object]:
    # The first rank's model-states file: the engine's own entries and the client's.
    for name in (_WHOLE_MODULE, STAGE3_MODEL_STATES):
        if (folder / name).is_file():
            return _load(folder / name, checkpoint)
    raise CheckpointError(
        os.fspath(checkpoint),
        f"has no model-states file in {folder.name!r}",
        fix="pass a complete checkpoint directory written by DeepSpeedStrategy",
    )


def _mapping(saved: Mapping[str, object], key: str, file: Path) -> Mapping[str, object]:
    value = saved.get(key)
    if not isinstance(value, Mapping):
        raise CheckpointError(
            os.fspath(file),
            f"holds no {key!r} mapping",
            fix="pass a complete checkpoint directory written by DeepSpeedStrategy",
        )
    return cast("Mapping[str, object]", value)


def _load(file: Path, checkpoint: PathLike) -> dict[str, object]:
    try:
        # Mapped, not read: a stage 1-2 model-states file holds the whole module, of
        # which only the entries asked for are read.
        loaded = torch.load(file, map_location="cpu", weights_only=False, mmap=True)
    except (OSError, RuntimeError, EOFError) as error:
        raise CheckpointError(
            os.fspath(checkpoint),
            f"has an unreadable {file.name}: {error}",
            fix="pass a complete checkpoint directory written by DeepSpeedStrategy",
        ) from error
    if not isinstance(loaded, dict):
        raise CheckpointError(os.fspath(checkpoint), f"has a {file.name} that holds no mapping")
    return loaded


def _rebuild(
    stage: int,
    shapes: list[Mapping[str, torch.Size]],
    base: list[Mapping[str, object]],
    flat: list[list[torch.Tensor]],
    alignment: object,
) -> StateDict:
    world_size = len(base)
    groups = cast("list[dict[str, object]]", base[0]["param_groups"])
    per_flat = [cast("Mapping[int, Mapping[str, object]]", one["state"]) for one in base]
    state: dict[str, dict[str, object]] = {}
    names_of_flat: list[list[str]] = []
    for index, group_shapes in enumerate(shapes):
        names_of_flat.append(list(group_shapes))
        held = per_flat[0].get(index, {})
        for key, first in held.items():
            if not isinstance(first, torch.Tensor) or first.dim() == 0:
                for name in group_shapes:
                    # A scalar (the step) for every parameter: a tensor of its own for
                    # each, which torch's optimizers increment in place.
                    own = first.clone() if isinstance(first, torch.Tensor) else first
                    state.setdefault(name, {})[key] = own
                continue
            # Each rank's part, without the padding that ends the last one.
            parts = [
                cast("torch.Tensor", per_flat[rank][index][key])[: flat[rank][index].numel()]
                for rank in range(world_size)
            ]
            if stage == 3:
                whole = _zero3_parameters(parts, group_shapes, world_size)
            else:
                paddings = (
                    cast("list[list[int]]", alignment)[index]
                    if isinstance(alignment, list)
                    else None
                )
                whole = _zero12_parameters(torch.cat(parts), group_shapes, paddings)
            for name, value in whole.items():
                state.setdefault(name, {})[key] = value
    param_groups = []
    for group in groups:
        flats = cast("list[int]", group["params"])
        names = [name for index in flats for name in names_of_flat[index]]
        param_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": names})
    return {"state": state, "param_groups": param_groups}


def _zero12_parameters(
    merged: torch.Tensor, shapes: Mapping[str, torch.Size], paddings: list[int] | None
) -> dict[str, torch.Tensor]:
    whole = {}
    offset = 0
    for position, (name, shape) in enumerate(shapes.items()):
        numel = math.prod(shape)
        whole[name] = merged.narrow(0, offset, numel).view(shape).float().clone()
        offset += numel + (paddings[position] if paddings else 0)
    return whole


def _zero3_parameters(
    parts: list[torch.Tensor], shapes: Mapping[str, torch.Size], world_size: int
) -> dict[str, torch.Tensor]:
    whole = {}
    offset = 0
    for name, shape in shapes.items():
        numel = math.prod(shape)
        share = math.ceil(numel / world_size)
        pieces = [part.narrow(0, offset, share) for part in parts]
        whole[name] = torch.cat(pieces)[:numel].view(shape).float().clone()
        offset += share
    return whole


def _stage0_optimizer_state(model_states: Mapping[str, object]) -> StateDict | None:
    saved = model_states.get("optimizer")
    module = model_states.get("module")
    if not isinstance(saved, Mapping) or not isinstance(module, Mapping):
        return None
    # torch's own layout, keyed by index: named by the names plait saved in the
    # optimizer's order (or, in a checkpoint without them, the module's order).
    groups = cast("list[dict[str, object]]", saved["param_groups"])
    indices = [index for group in groups for index in cast("list[int]", group["params"])]
    names = model_states.get(PARAMETER_NAMES)
    if not isinstance(names, list):
        buffers = model_states.get("buffer_names")
        skipped = set(cast("list[str]", buffers)) if isinstance(buffers, list) else set()
        names = [key for key in module if key not in skipped]
    if len(names) != len(indices):
        return None
    named = dict(zip(indices, cast("list[str]", names), strict=True))
    per_parameter = cast("Mapping[int, object]", saved["state"])
    return {
        "state": {named[index]: value for index, value in per_parameter.items()},
        "param_groups": [
            {**group, "params": [named[i] for i in cast("list[int]", group["params"])]}
            for group in groups
        ],
    }


def consolidate(
    checkpoint: PathLike,
    output: PathLike,
    *,
    weights_only: bool = False,
    tag: str | None = None,
) -> None:
    """Write a DeepSpeed checkpoint as one ``torch.save`` file, in fp32.

    The file loads with plain PyTorch, without deepspeed:
    ``model.load_state_dict(torch.load(output)["state_dict"])``.
    `plait.strategies.consolidate_checkpoint` calls it for any DeepSpeed directory.

    Args:
        checkpoint: A checkpoint directory `DeepSpeedStrategy` wrote.
        output: The file to write.
        weights_only: Keep the weights alone; otherwise the optimizer's whole state
            (``optimizer_states``, as the other strategies write it) and the run's
            own entries (the step, a scheduler's state: what `save_checkpoint` was
            given beside the module and optimizers) too: a file any strategy
            resumes from.
        tag: The tag to read (``latest``'s by default).

    Raises:
        CheckpointError: ``checkpoint`` is not a complete DeepSpeed checkpoint, or
            ``output`` cannot be written.
    """
    if weights_only:
        write_file({"state_dict": fp32_state_dict(checkpoint, tag=tag)}, output)
    else:
        write_file(read_whole(checkpoint, tag=tag), output)
