"""The trainer's checkpoints: built from every part of a run, saved, checked and restored."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Final

from plait.core import CheckpointError
from plait.trainer.gather import gather_objects
from plait.trainer.hparams import class_path
from plait.trainer.state import rng_state

if TYPE_CHECKING:
    from plait.core import Strategy
    from plait.core.typing import Checkpoint, PathLike
    from plait.trainer.attach import Attached
    from plait.trainer.callbacks.base import Callback
    from plait.trainer.progress import Progress, Resume
    from plait.trainer.results import Results

__all__ = ["CHECKPOINT_FORMAT", "Checkpointer", "check_checkpoint"]

CHECKPOINT_FORMAT: Final = 1
"""The layout version of the checkpoints the trainer writes."""


def check_checkpoint(checkpoint: Checkpoint, path: PathLike | None) -> None:
    """Refuse a checkpoint the trainer did not write.

    Raises:
        CheckpointError: It lacks the module's state or the loops' position.
    """
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

    def build(self, attached: Attached) -> Checkpoint:
        """The checkpoint of the run as it stands (collective: every rank calls it)."""
        strategy, progress = self.strategy, self.progress
        module = attached.module
        states = gather_objects(strategy, rng_state())
        metrics = self.results.active
        checkpoint: Checkpoint = {
            "plait": {"format": CHECKPOINT_FORMAT, "module": class_path(type(module))},
            # What load_from_checkpoint makes the module again from.
            "hyper_parameters": dict(module.hparams),
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
        attached.hooks.on_save_checkpoint(checkpoint)
        return checkpoint

    def save(self, attached: Attached, path: PathLike) -> None:
        """Build the checkpoint and save it at ``path`` (every rank calls it)."""
        strategy = self.strategy
        with attached.hooks.profiler.region("save_checkpoint"):
            strategy.save_checkpoint(self.build(attached), path)
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
