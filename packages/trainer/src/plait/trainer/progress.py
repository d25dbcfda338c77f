"""Where training stands: a few counters, kept by the trainer and saved in its checkpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from plait.core import rank_zero_warn

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint

__all__ = ["Progress", "Resume"]


@attrs.frozen
class Resume:
    """Where the first epoch of a resumed run starts.

    Attributes:
        start_batch: Batches of the epoch already run (skipped, in the same order).
        rng: This rank's random states, restored when training goes on.
        metrics: The epoch's logged values so far.
    """

    start_batch: int = 0
    rng: dict[str, object] | None = None
    metrics: dict[str, object] | None = None


@attrs.define
class Progress:
    """The trainer's counters: one flat object, no trackers to compare.

    It outlives a run (a second ``fit`` goes on from it) and travels to the ranks
    with the trainer. `state_dict` is the checkpoint's ``"loops"`` section.

    Attributes:
        current_epoch: The epoch being run (epochs finished, between epochs).
        global_step: Optimizer steps taken.
        should_stop: Whether training stops at the end of this epoch (any rank may
            set it; the ranks agree at the epoch's end).
        batches_done: Batches of the current epoch run so far.
        epoch_done: Whether the current epoch ran to its end.
        sampler_seed: The seed every epoch's data order follows from.
        training_batches: Batches in this epoch (0 when the loader cannot say);
            not saved.
        eval_batches: Batches in the running evaluation (0 when unknown); not saved.
    """

    current_epoch: int = 0
    global_step: int = 0
    should_stop: bool = False
    batches_done: int = 0
    epoch_done: bool = False
    sampler_seed: int = 0
    training_batches: int = 0
    eval_batches: int = 0

    def state_dict(self, train_metrics: dict[str, object] | None) -> dict[str, object]:
        """The checkpoint's ``"loops"`` section, with the epoch's logged values so far."""
        return {
            "epoch": self.current_epoch,
            "batches_done": self.batches_done,
            "epoch_done": self.epoch_done,
            "sampler_seed": self.sampler_seed,
            "train_metrics": train_metrics,
        }

    def load(self, checkpoint: Checkpoint, *, global_rank: int, world_size: int) -> Resume:
        """Take the counters of ``checkpoint``; where its first epoch starts, for this rank."""
        loops = checkpoint["loops"]
        self.global_step = int(checkpoint["global_step"])
        self.current_epoch = int(loops["epoch"])
        start = int(loops["batches_done"])
        metrics_state = loops.get("train_metrics")
        if loops["epoch_done"]:
            self.current_epoch += 1
            start, metrics_state = 0, None
        states = checkpoint.get("rng_states") or []
        mine: dict[str, object] | None = None
        if len(states) == world_size:
            mine = states[global_rank]
        elif states:
            rank_zero_warn(
                f"the checkpoint holds the random states of {len(states)} ranks, and this run "
                f"has {world_size}: they are not restored"
            )
        return Resume(start_batch=start, rng=mine, metrics=metrics_state)
