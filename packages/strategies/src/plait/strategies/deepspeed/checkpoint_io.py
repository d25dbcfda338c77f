"""DeepSpeed's checkpoints: a directory the engine writes, each rank its partitions.

A checkpoint at ``path`` is a directory holding one tag directory (the engine's files:
the module's state, each rank's optimizer partitions) and a file ``latest`` naming it.
The engine writes it under ``<path>.partial``; once every rank has written, the size
and CRC-32 of every file are kept beside them and the directory is put in place whole
(`plait.core.checkpoint_dirs`): a save that dies half-way leaves the previous
checkpoint whole and nothing incomplete under a checkpoint's name, and a changed,
truncated or missing file is refused at load, naming it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

import torch
from typing_extensions import override

from plait.core import CheckpointError
from plait.core.checkpoint_dirs import check, clean_interrupted, partial_of, seal
from plait.strategies.deepspeed import library
from plait.strategies.deepspeed.export import read_fp32_state
from plait.strategies.deepspeed.layout import (
    PARAMETER_NAMES,
    STAGE3_MODEL_STATES,
    client_entries,
    client_state_of,
    latest_tag,
)

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike
    from plait.strategies.deepspeed.engine import EngineHost

__all__ = [
    "PARAMETER_NAMES",
    "STAGE3_MODEL_STATES",
    "DeepSpeedCheckpointIO",
    "client_entries",
    "client_state_of",
    "latest_tag",
]

_TAG_PREFIX: Final = "checkpoint-"


class DeepSpeedCheckpointIO:
    """Saves, loads and removes checkpoints through a strategy's DeepSpeed engine.

    Collective: every rank calls each method (the engine writes each rank's part).
    """

    collective: Final = True
    format: Final = "deepspeed"

    def __init__(self, strategy: EngineHost) -> None:
        self._strategy = strategy

    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Have the engine write its state, and ``checkpoint``'s other entries, to ``path``.

        Raises:
            CheckpointError: ``path`` is a file.
        """
        strategy = self._strategy
        directory = Path(path)
        if directory.exists() and not directory.is_dir():
            raise CheckpointError(
                os.fspath(path),
                "is a file, and a DeepSpeed checkpoint is a directory",
                fix="save to another path, or remove the file",
            )
        partial = partial_of(directory)
        # The ranks agree on the new tag (one more than rank 0 sees: a tool reading
        # the tags sees them grow), once rank 0 cleared what an earlier save left.
        if strategy.is_global_zero:
            shutil.rmtree(partial, ignore_errors=True)
        tag = strategy.broadcast(_next_tag(directory) if strategy.is_global_zero else "")
        client_state = client_state_of(checkpoint)
        client_state[PARAMETER_NAMES] = strategy.optimizer_parameter_names
        with library.quiet():
            strategy.engine.save_checkpoint(
                os.fspath(partial),
                tag=tag,
                client_state=client_state,
                exclude_frozen_parameters=strategy.exclude_frozen_parameters,
            )
        strategy.barrier("deepspeed save_checkpoint")
        # Every rank has written: digested and put in place.
        seal(partial, directory)
        strategy.barrier("deepspeed save_checkpoint in place")

    def load_checkpoint(self, path: PathLike, map_location: object = None) -> Checkpoint:
        """Load ``path`` into the engine (see `load_into_engine`)."""
        del map_location  # the engine places each partition on its device
        return self.load_into_engine(path)

    def load_into_engine(self, path: PathLike, *, optimizer: bool = True) -> Checkpoint:
        """Load the engine's state from ``path`` in place, and return the other entries.

        The optimizer's partitions are loaded when the engine has an optimizer (and
        ``optimizer`` is true).

        Raises:
            CheckpointError: ``path`` is not a complete DeepSpeed checkpoint, or the
                engine cannot read it (another model, another ZeRO stage).
        """
        tag = latest_tag(path)
        strategy = self._strategy
        check(path)
        engine = strategy.engine
        if strategy.stage == 3 and not strategy.has_optimizer:
            # An engine without an optimizer (to evaluate) has no partitions of fp32
            # weights to read into: the weights are rebuilt whole, and set from rank 0.
            return self._load_weights(path, tag)
        try:
            with library.quiet():
                loaded, client_state = engine.load_checkpoint(
                    os.fspath(path),
                    tag=tag,
                    # Frozen parameters left out of the save stay as they are.
                    load_module_strict=not strategy.exclude_frozen_parameters,
                    load_optimizer_states=optimizer and self._strategy.has_optimizer,
                    load_lr_scheduler_states=False,
                )
        except (RuntimeError, KeyError, AssertionError, ValueError) as error:
            raise CheckpointError(
                os.fspath(path),
                f"cannot be loaded by this DeepSpeed engine: {error}",
                fix="resume with the model and the ZeRO stage the checkpoint was written with",
            ) from error
        if loaded is None or client_state is None:
            raise CheckpointError(
                os.fspath(path), f"has no readable tag {tag!r}", fix="resume from another"
            )
        return {**client_entries(client_state), "state_dict": {}, "optimizer_states": []}

    def _load_weights(self, path: PathLike, tag: str) -> Checkpoint:
        strategy = self._strategy
        first = Path(path) / tag / STAGE3_MODEL_STATES
        try:
            saved = torch.load(first, map_location="cpu", weights_only=False)
        except (OSError, RuntimeError) as error:
            raise CheckpointError(
                os.fspath(path),
                f"has no readable {first.name} in {tag!r}: {error}",
                fix="pass a checkpoint DeepSpeedStrategy wrote at ZeRO stage 3",
            ) from error
        state = read_fp32_state(path, tag=tag) if strategy.is_global_zero else {}
        strategy.load_whole_module_state(state, source=path)
        return {**client_entries(saved), "state_dict": {}, "optimizer_states": []}

    def remove_checkpoint(self, path: PathLike) -> None:
        """Remove the checkpoint directory ``path`` (on rank 0, once every rank is here)."""
        strategy = self._strategy
        strategy.barrier("deepspeed remove_checkpoint")
        if strategy.is_global_zero:
            shutil.rmtree(os.fspath(path), ignore_errors=True)

    def remove_partial(self, directory: PathLike) -> list[str]:
        """Remove what saves killed midway left in ``directory`` (see `clean_interrupted`).

        Call it where no save is in progress, as `ModelCheckpoint` does when a run
        starts (on rank 0).
        """
        return clean_interrupted(directory)

    def teardown(self) -> None:
        """Nothing pending: the engine's saves are synchronous."""

    @override
    def __repr__(self) -> str:
        return "DeepSpeedCheckpointIO()"


def _next_tag(directory: Path) -> str:
    numbers = (
        [
            int(child.name.removeprefix(_TAG_PREFIX))
            for child in directory.glob(f"{_TAG_PREFIX}*")
            if child.name.removeprefix(_TAG_PREFIX).isdigit()
        ]
        if directory.is_dir()
        else []
    )
    return f"{_TAG_PREFIX}{max(numbers, default=0) + 1}"
