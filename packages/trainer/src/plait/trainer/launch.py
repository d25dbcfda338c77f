"""Handing a run back: what rank 0 sends to the process that called the Trainer.

A launcher may run the ranks on copies of the caller's trainer and module (spawned
processes); `run_in_rank` is every rank's body, and rank 0's `Outcome` carries what
the caller's objects must learn: the trained state, the callbacks' states, the
metrics and the counters.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

import attrs

from plait.core import seed_everything
from plait.core.seed import SEED_ENV_VAR
from plait.trainer.state import set_rng_state

if TYPE_CHECKING:
    import torch

    from plait.core import Strategy
    from plait.trainer.attach import Run
    from plait.trainer.metrics import Number
    from plait.trainer.module import Module
    from plait.trainer.trainer import Trainer

__all__ = [
    "TRAINED_CHECKPOINT",
    "Outcome",
    "gather_module_state",
    "identity",
    "origin",
    "run_in_rank",
]


@attrs.frozen
class Outcome:
    """What a run sends back from rank 0 to the process that called the trainer.

    Attributes:
        trainer: The process and trainer object that ran it (`identity`).
        state_dict: The module's trained state, on the CPU, where a fit worked on a
            copy of the caller's module that every rank holds whole; ``None`` where it
            trained that module itself, or did not train.
        trained_checkpoint: Where a fit on copies of a sharded module saved its final
            state (never gathered whole); ``None`` otherwise.
        callback_states: Each stateful callback's state, by `Callback.state_key`.
        callback_metrics: The trainer's metrics at the end.
        logged_metrics: The last values sent to the loggers.
        progress_bar_metrics: The values shown in the progress bar.
        current_epoch: The epoch the run stopped at.
        global_step: Optimizer steps taken.
        log_dir: The first logger's directory, if there is a logger.
        world_size: The processes in the job.
        results: What `Trainer.validate`/`Trainer.test` return, or predictions.
    """

    trainer: tuple[int, int]
    state_dict: dict[str, torch.Tensor] | None
    trained_checkpoint: str | None
    callback_states: dict[str, dict[str, object]]
    callback_metrics: dict[str, Number]
    logged_metrics: dict[str, Number]
    progress_bar_metrics: dict[str, Number]
    current_epoch: int
    global_step: int
    log_dir: str | None
    world_size: int
    results: object


TRAINED_CHECKPOINT: Final = "trained.ckpt"
"""Where (in ``default_root_dir``) a fit on spawned copies of a sharded module saves it."""


def origin(module: Module) -> tuple[int, int]:
    """Which object ``module`` is, in which process: a rank that works on a copy sees another."""
    return os.getpid(), id(module)


def identity(trainer: Trainer) -> tuple[int, int]:
    """Which trainer object this is, in which process."""
    return os.getpid(), id(trainer)


def gather_module_state(strategy: Strategy, module: Module) -> dict[str, torch.Tensor]:
    """The state of a module every rank holds whole, on the CPU, to hand back to the caller."""
    # A DTensor here is replicated (FSDP's NO_SHARD).
    state = strategy.get_state_dict(module)["state_dict"]
    gathered = {}
    for key, value in state.items():
        whole = getattr(value, "full_tensor", None)
        gathered[key] = (whole() if callable(whole) else value).detach().cpu()
    return gathered


def run_in_rank(trainer: Trainer, model: Module, run: Run) -> Outcome:
    """The body of every rank: run the stage, and say how it ended."""
    if os.getpid() != run.origin[0] and SEED_ENV_VAR in os.environ:
        # A process a launcher started afresh: seeded as the caller was, and then
        # at the caller's random states, as a rank that ran the caller's program up
        # to this call would be (ddp and ddp_spawn give the same run).
        seed_everything()
        if run.random_state is not None:
            set_rng_state(run.random_state)
    results = trainer.run_stage(model, run)
    return trainer.outcome(results)
