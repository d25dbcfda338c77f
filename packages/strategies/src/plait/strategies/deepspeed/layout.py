"""What a DeepSpeed checkpoint directory holds, and how plait names its entries in it.

The engine writes one tag directory per save and a file ``latest`` naming the
newest; beside the engine's own entries of its model-states file, the entries of
the strategy's caller (its "client state") are kept under names the engine never
writes. The checkpoint IO writes and loads them; the export and the registered
format read them without DeepSpeed.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from plait.core import CheckpointError

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike

__all__ = [
    "LATEST",
    "PARAMETER_NAMES",
    "STAGE3_MODEL_STATES",
    "client_entries",
    "client_state_of",
    "latest_tag",
]

LATEST: Final = "latest"
"""The file in a DeepSpeed checkpoint directory that names its newest tag."""
# What the engine writes itself; the rest of a checkpoint is its "client state".
_ENGINE_KEYS: Final = ("state_dict", "optimizer_states")
STAGE3_MODEL_STATES: Final = "zero_pp_rank_0_mp_rank_00_model_states.pt"
# What the engine itself keeps in its model-states file, beside the client state.
_ENGINE_STATE: Final = frozenset(
    {
        "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
        "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler",
        "random_ltd", "sparse_tensor_module_names", "skipped_steps", "global_steps",
        "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
    }
)  # fmt: skip
# The prefix of a client entry named as one of the engine's (kept apart from it).
_KEPT_APART: Final = "plait_client/"
# The client state's own keys, saved beside it: what loading gives back, and nothing
# the engine adds (its list of those grows with DeepSpeed's versions).
_CLIENT_KEYS: Final = "plait_client_keys"
# The names of the optimizer's parameters, in its order, saved beside the client
# state: an optimizer state rebuilt whole is keyed by them.
PARAMETER_NAMES: Final = "plait_parameter_names"


def client_entries(saved: Mapping[str, object]) -> Checkpoint:
    """The entries of a model-states file that the strategy's caller saved."""
    keys = saved.get(_CLIENT_KEYS)
    if isinstance(keys, list):
        return {
            key: saved[_KEPT_APART + key] if _KEPT_APART + key in saved else saved[key]
            for key in keys
            if key in saved or _KEPT_APART + key in saved
        }
    return {key: value for key, value in saved.items() if key not in _ENGINE_STATE}


def client_state_of(checkpoint: Mapping[str, object]) -> dict[str, object]:
    """The entries the engine keeps beside its own, each under a name it never writes.

    The engine puts the client state over its own entries: an entry named as one of
    them (``module``, ``optimizer``, ``global_steps``...) would replace the engine's
    and break the checkpoint. Such an entry is saved under another name (and given
    back under its own by `client_entries`), with a warning.
    """
    entries = {key: value for key, value in checkpoint.items() if key not in _ENGINE_KEYS}
    colliding = sorted(key for key in entries if key in _ENGINE_STATE)
    if colliding:
        warnings.warn(
            f"the checkpoint's entries {colliding} are named as entries DeepSpeed's engine "
            "writes itself; they are saved apart from the engine's and loaded back under "
            "their names, but a tool reading the checkpoint with DeepSpeed alone will not "
            "find them there (rename them to be read so)",
            UserWarning,
            stacklevel=4,
        )
    client = {(_KEPT_APART + key if key in colliding else key): v for key, v in entries.items()}
    client[_CLIENT_KEYS] = sorted(entries)
    return client


def latest_tag(path: PathLike) -> str:
    """The tag ``latest`` names in the checkpoint directory ``path``.

    Raises:
        CheckpointError: ``path`` is not a complete DeepSpeed checkpoint.
    """
    latest = Path(path) / LATEST
    try:
        tag = latest.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise CheckpointError(
            os.fspath(path),
            f"is not a DeepSpeed checkpoint: {error.strerror or error}",
            fix="pass a directory written by DeepSpeedStrategy (it holds a 'latest' file)",
        ) from error
    if not (Path(path) / tag).is_dir():
        raise CheckpointError(
            os.fspath(path),
            f"names the tag {tag!r} in 'latest', and has no directory {tag!r}",
            fix="the checkpoint is incomplete: resume from an earlier one",
        )
    return tag
