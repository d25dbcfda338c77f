"""The trainer's checkpoints: built from every part of a run, saved, checked and restored."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from plait.core import (
    CheckpointError,
    CheckpointFormatRegistry,
    ConfigurationError,
    detect_checkpoint_format,
    is_collective,
    rank_zero_warn,
)
from plait.trainer.callbacks.checkpoint import ModelCheckpoint
from plait.trainer.gather import gather_objects
from plait.trainer.hparams import class_path, saved
from plait.trainer.state import rng_state

if TYPE_CHECKING:
    from plait.core import Strategy
    from plait.core.typing import Checkpoint, PathLike
    from plait.trainer.callbacks.base import Callback
    from plait.trainer.limits import Stage
    from plait.trainer.progress import Progress, Resume
    from plait.trainer.results import Results
    from plait.trainer.run_state import Attached

__all__ = [
    "CHECKPOINT_FORMAT",
    "LIGHTNING_LAYOUT",
    "LIGHTNING_VERSION_KEY",
    "Checkpointer",
    "check_checkpoint",
    "from_lightning",
    "is_checkpoint",
    "newest_checkpoint",
    "resolve_checkpoint",
]

CHECKPOINT_FORMAT: Final = 1
"""The layout version of the checkpoints the trainer writes."""

LIGHTNING_VERSION_KEY: Final = "pytorch-lightning_version"
"""The entry every checkpoint Lightning's Trainer writes holds: its version."""

LIGHTNING_LAYOUT: Final = "2.0.0"
"""What the trainer's checkpoints hold under `LIGHTNING_VERSION_KEY`: the Lightning
release whose layout their ``state_dict``, ``hyper_parameters``, ``epoch``,
``global_step``, ``optimizer_states`` and ``lr_schedulers`` follow, so that
Lightning's tooling (``LightningModule.load_from_checkpoint``) reads them, and runs
none of its migrations of older layouts over them."""

# Where Lightning's precision plugins keep their state (a gradient scaler's): under
# the plugin's class name.
_LIGHTNING_PRECISION_KEYS: Final = ("MixedPrecision", "MixedPrecisionPlugin", "FSDPPrecision")


def _nested(mapping: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(key)
    return mapping


def from_lightning(checkpoint: Checkpoint) -> Checkpoint:
    """A checkpoint Lightning's Trainer wrote, in the layout this trainer resumes from.

    The module's and optimizers' states, the schedulers', the hyperparameters, the
    epoch and the global step are the same entries in both. Lightning's loops are
    read for where the epoch stood (its batches done, whether it ran to its end),
    and a gradient scaler's state is moved to where the precision plugin reads it.
    Lightning's callbacks keep their states under keys and in layouts of their own:
    they are left out, with a warning naming them. Any other checkpoint is returned
    as it is.
    """
    if LIGHTNING_VERSION_KEY not in checkpoint or "plait" in checkpoint:
        return checkpoint
    converted = dict(checkpoint)
    loop = _nested(checkpoint, "loops", "fit_loop")
    batches = _nested(loop, "epoch_loop.batch_progress")
    done = _nested(batches, "current", "completed")
    epoch = checkpoint.get("epoch", 0)
    converted["loops"] = {
        "epoch": epoch if isinstance(epoch, int) else 0,
        "batches_done": done if isinstance(done, int) else 0,
        "epoch_done": bool(_nested(batches, "is_last_batch")),
        "train_metrics": None,
    }
    for key in _LIGHTNING_PRECISION_KEYS:
        state = converted.pop(key, None)
        if isinstance(state, Mapping) and state:
            converted["precision"] = {"scaler": dict(state)}
    callbacks = converted.pop("callbacks", None)
    if isinstance(callbacks, Mapping) and callbacks:
        rank_zero_warn(
            f"the checkpoint was written by Lightning {checkpoint[LIGHTNING_VERSION_KEY]}: its "
            f"callbacks' states ({', '.join(map(str, callbacks))}) are in Lightning's layout "
            "and are not restored; the module, optimizers, schedulers, epoch and step are"
        )
    return converted


def check_checkpoint(checkpoint: Checkpoint, path: PathLike | None, stage: str = "fit") -> None:
    """Refuse a checkpoint the trainer did not write, or one of weights only to resume.

    Raises:
        CheckpointError: It lacks the module's state or the loops' position, or
            ``stage`` is ``"fit"`` and it holds the weights only.
    """
    header = checkpoint.get("plait")
    if stage == "fit" and isinstance(header, Mapping) and header.get("weights_only"):
        raise CheckpointError(
            str(path),
            "holds the module's weights only (saved with save_weights_only=True): no "
            "optimizer state, schedulers or random states to resume training from",
            fix="pass it to validate, test or predict (ckpt_path=...), or load its "
            "weights (model.load_state_dict(torch.load(path)['state_dict'])) and fit "
            "without ckpt_path; to resume, save with save_weights_only=False",
        )
    missing = [key for key in ("state_dict", "loops") if key not in checkpoint]
    if missing:
        raise CheckpointError(
            str(path),
            f"is not a trainer checkpoint: it lacks {', '.join(missing)}",
            fix="resume from a checkpoint written by ModelCheckpoint or "
            "Trainer.save_checkpoint; load other files into the module yourself",
        )


class Checkpointer:
    """Builds, saves and restores a run's checkpoint.

    A checkpoint holds the strategy's share (module, optimizers, precision; sharded
    or full), the schedulers, the callbacks' states, the loops' position and every
    rank's random states.

    Args:
        strategy: Saves and reads the files.
        progress: The loops' position.
        results: The running epoch's logged values.
        callbacks: The trainer's callbacks (their states go in).
        timeout: How long the other ranks wait for a save.
    """

    def __init__(
        self,
        strategy: Strategy,
        progress: Progress,
        results: Results,
        callbacks: list[Callback],
        *,
        timeout: timedelta,
    ) -> None:
        self.strategy = strategy
        self.progress = progress
        self.results = results
        self.callbacks = callbacks
        self.timeout = timeout

    def build(self, attached: Attached, *, weights_only: bool = False) -> Checkpoint:
        """The checkpoint of the run as it stands (collective: every rank calls it).

        With ``weights_only``, the module's state, its hyperparameters and where the
        run stood, without optimizers, schedulers, callbacks or random states: enough
        to validate, test, predict or start training afresh, not to resume.
        """
        strategy, progress = self.strategy, self.progress
        module = attached.module
        metrics = self.results.active
        header: dict[str, object] = {
            "format": CHECKPOINT_FORMAT,
            "module": class_path(type(module)),
        }
        if weights_only:
            weights: Checkpoint = {
                "plait": {**header, "weights_only": True},
                LIGHTNING_VERSION_KEY: LIGHTNING_LAYOUT,
                "hyper_parameters": saved(module.hparams),
                "epoch": progress.current_epoch,
                "global_step": progress.global_step,
                "loops": progress.state_dict(None),
                "state_dict": strategy.get_state_dict(module, [])["state_dict"],
            }
            attached.hooks.on_save_checkpoint(weights)
            return weights
        states = gather_objects(strategy, rng_state())
        checkpoint: Checkpoint = {
            "plait": header,
            LIGHTNING_VERSION_KEY: LIGHTNING_LAYOUT,
            # What load_from_checkpoint makes the module again from.
            "hyper_parameters": saved(module.hparams),
            "epoch": progress.current_epoch,
            "global_step": progress.global_step,
            "loops": progress.state_dict(
                metrics.state_dict() if metrics is not None and metrics.training else None
            ),
            # The strategy's share: module, optimizers and precision (sharded or full).
            **strategy.get_state_dict(module, attached.optimizers),
            "lr_schedulers": [config.scheduler.state_dict() for config in attached.schedulers],
            "callbacks": {c.state_key: c.state_dict() for c in self.callbacks},
            "rng_states": states,
        }
        datamodule = attached.datamodule
        if datamodule is not None and datamodule.hparams:
            checkpoint["datamodule_hyper_parameters"] = saved(datamodule.hparams)
        attached.hooks.on_save_checkpoint(checkpoint)
        return checkpoint

    def save(self, attached: Attached, path: PathLike, *, weights_only: bool = False) -> None:
        """Build the checkpoint and save it at ``path`` (every rank calls it)."""
        strategy = self.strategy
        with attached.hooks.profiler.region("save_checkpoint"):
            strategy.save_checkpoint(self.build(attached, weights_only=weights_only), path)
        # A save of a large model may take longer than any collective should: the
        # wait for it has a bound of its own.
        strategy.barrier("save_checkpoint", timeout=self.timeout)

    def restore(self, attached: Attached, checkpoint: Checkpoint) -> Resume:
        """Load the trainer's share of ``checkpoint``: schedulers, callbacks, loops' position."""
        strategy = self.strategy
        for config, state in zip(
            attached.schedulers, checkpoint.get("lr_schedulers", []), strict=False
        ):
            config.scheduler.load_state_dict(state)
        for callback in self.callbacks:
            state = checkpoint.get("callbacks", {}).get(callback.state_key)
            if state is not None:
                callback.load_state_dict(state)
        return self.progress.load(
            checkpoint, global_rank=strategy.global_rank, world_size=strategy.world_size
        )


def is_checkpoint(path: str, strategy: Strategy) -> bool:
    """Whether ``path`` holds a checkpoint ``strategy`` can read (or its IO's directory)."""
    # A collective checkpoint IO writes each checkpoint as a directory of parts;
    # every strategy reads a checkpoint of any registered format (FSDP's shards,
    # DeepSpeed's directory, yours) whole.
    if os.path.isfile(path) or detect_checkpoint_format(path) is not None:
        return True
    return os.path.isdir(path) and is_collective(strategy.checkpoint_io)


def resolve_checkpoint(
    ckpt_path: PathLike | None,
    stage: Stage,
    *,
    strategy: Strategy,
    callback: ModelCheckpoint | None,
    root: str,
) -> str | None:
    """The checkpoint a stage starts from: ``ckpt_path``, or the one ``"last"``/``"best"`` names.

    ``"last"`` is the newest complete checkpoint in the callback's directory: ``last.ckpt``,
    unless a run stopped after writing a newer one and before ``last.ckpt``'s save
    completed; ``None`` when there is none and the stage is ``fit`` (training starts
    afresh).

    Raises:
        ConfigurationError: ``"last"`` or ``"best"`` without a checkpoint callback, or
            ``"best"`` before any is known.
        CheckpointError: The path does not exist, or is a directory no strategy wrote.
    """
    if ckpt_path is None:
        return None
    path = os.fspath(ckpt_path)
    if path in ("last", "best"):
        if callback is None:
            raise ConfigurationError(
                f"ckpt_path={path!r} needs a ModelCheckpoint, and checkpointing is off",
                value=path,
                fix="pass the checkpoint's path, or enable_checkpointing=True",
            )
        directory = callback.dirpath or os.path.join(root, "checkpoints")
        if path == "best":
            if not callback.best_model_path:
                raise ConfigurationError(
                    "ckpt_path='best': no best checkpoint is known yet",
                    value=path,
                    fix="run fit first, or pass the checkpoint's path",
                )
            return callback.best_model_path
        last = os.path.join(directory, "last" + ModelCheckpoint.FILE_EXTENSION)
        newest = newest_checkpoint(directory, lambda found: is_checkpoint(found, strategy))
        last_exists = is_checkpoint(last, strategy)
        if newest is not None and last_exists and os.path.samefile(newest, last):
            return last
        if newest is not None:
            if last_exists:
                rank_zero_warn(
                    f"ckpt_path='last': {newest} is newer than {last} (the run stopped "
                    "between the two saves); resuming from the newest complete checkpoint"
                )
            else:
                rank_zero_warn(
                    f"ckpt_path='last': {last} does not exist (its save did not complete); "
                    f"resuming from the newest complete checkpoint, {newest}"
                )
            return newest
        if stage != "fit":
            raise CheckpointError(last, "does not exist", fix="run fit first")
        rank_zero_warn(f"ckpt_path='last': {last} does not exist; training starts afresh")
        return None
    if "://" not in path and not is_checkpoint(path, strategy):
        if os.path.isdir(path):
            formats = ", ".join(CheckpointFormatRegistry.available())
            raise CheckpointError(
                path,
                "is a directory that no strategy wrote (no registered checkpoint format, "
                f"of {formats}, recognises it), and "
                f"this strategy's checkpoint IO ({strategy.checkpoint_io!r}) reads files",
                fix="pass a .ckpt file in it, or a checkpoint directory a strategy wrote "
                "(an incomplete one, from a run stopped while saving, cannot be read: "
                "use an earlier one)",
            )
        raise CheckpointError(
            path,
            "does not exist",
            fix="pass the path of a .ckpt file, or ckpt_path='last' to resume from the "
            "newest checkpoint",
        )
    return path


def newest_checkpoint(directory: str, is_checkpoint: Callable[[str], bool]) -> str | None:
    """The newest ``*.ckpt`` in ``directory`` that ``is_checkpoint``; ``None`` if none is.

    Saves rename complete checkpoints into place, so every ``*.ckpt`` here is whole,
    and the newest modification time of a file (of a directory or an entry in it) is
    when its save completed. Of equally new ones (``last.ckpt`` is a hard link to the
    epoch's file), ``last.ckpt`` is preferred.
    """
    found = [
        path
        for path in glob.glob(
            os.path.join(glob.escape(directory), "*" + ModelCheckpoint.FILE_EXTENSION)
        )
        if is_checkpoint(path)
    ]
    last = "last" + ModelCheckpoint.FILE_EXTENSION
    return (
        max(found, key=lambda path: (_completed(path), os.path.basename(path) == last))
        if found
        else None
    )


def _completed(path: str) -> float:
    """When the save of the checkpoint at ``path`` (a file, or a directory of parts) ended."""
    if not os.path.isdir(path):
        return os.path.getmtime(path)
    with os.scandir(path) as entries:
        return max([os.path.getmtime(path), *(entry.stat().st_mtime for entry in entries)])
