"""From a DeepSpeed checkpoint to one file of fp32 weights that plain PyTorch loads."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

import torch

from plait.core import CheckpointError
from plait.strategies.deepspeed import library
from plait.strategies.deepspeed.checkpoint_io import (
    STAGE3_MODEL_STATES,
    client_entries,
    latest_tag,
)
from plait.strategies.export import write_file

if TYPE_CHECKING:
    from plait.core.typing import PathLike, StateDict

__all__ = ["consolidate_checkpoint", "fp32_state_dict", "read_fp32_state", "read_run_entries"]

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
    keys = list(state)
    if keys and all(key.startswith(_TRAINER_PREFIX) for key in keys):
        state = {key.removeprefix(_TRAINER_PREFIX): value for key, value in state.items()}
    return state


def read_fp32_state(checkpoint: PathLike, *, tag: str | None = None) -> StateDict:
    """The engine's module state in fp32, with the keys the engine's module has.

    Raises:
        CheckpointError: ``checkpoint`` is not a complete DeepSpeed checkpoint.
    """
    zero_to_fp32 = library.import_submodule("utils.zero_to_fp32")
    rebuild: Callable[..., Mapping[str, torch.Tensor]] = (
        zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint
    )

    chosen = tag if tag is not None else latest_tag(checkpoint)
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


def consolidate_checkpoint(
    checkpoint: PathLike,
    output: PathLike,
    *,
    tag: str | None = None,
    run_entries: bool = False,
) -> None:
    """Write a DeepSpeed checkpoint's weights as one ``torch.save`` file, in fp32.

    The file loads with plain PyTorch, without deepspeed:
    ``model.load_state_dict(torch.load(output)["state_dict"])``.
    `plait.strategies.consolidate_checkpoint` calls it for any DeepSpeed directory.

    Args:
        checkpoint: A checkpoint directory `DeepSpeedStrategy` wrote.
        output: The file to write.
        tag: The tag to read (``latest``'s by default).
        run_entries: Keep the run's own entries too (the step, a scheduler's state:
            what `save_checkpoint` was given beside the module and optimizers).

    Raises:
        CheckpointError: ``checkpoint`` is not a complete DeepSpeed checkpoint, or
            ``output`` cannot be written.
    """
    state = fp32_state_dict(checkpoint, tag=tag)
    kept: dict[str, object] = {"state_dict": state}
    if run_entries:
        kept = {**read_run_entries(checkpoint, tag), **kept}
    write_file(kept, output)


def read_run_entries(checkpoint: PathLike, tag: str | None = None) -> dict[str, object]:
    """What the run saved beside the module and optimizers (the step, a scheduler)."""
    chosen = tag if tag is not None else latest_tag(checkpoint)
    for name in (_WHOLE_MODULE, STAGE3_MODEL_STATES):
        first = Path(checkpoint) / chosen / name
        if first.is_file():
            saved = torch.load(first, map_location="cpu", weights_only=False)
            return dict(client_entries(saved))
    return {}
