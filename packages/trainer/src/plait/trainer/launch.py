"""Starting a run's ranks, and handing rank 0's result back to the process that called.

`Launch` is the Trainer's collaborator: it starts the ranks through the strategy's
launcher (or runs the stage in this process), and brings back what rank 0 says. A
launcher may run the ranks on copies of the caller's trainer and module (spawned
processes); `run_in_rank` is every rank's body, and rank 0's `Outcome` carries what
the caller's objects must learn: the trained state, the callbacks' states, the
metrics and the counters.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

import attrs
from typing_extensions import override

from plait.core import (
    SupportsLauncher,
    SupportsShardedModule,
    SupportsStopTimeout,
    rank_zero_warn,
    seed_everything,
)
from plait.core.seed import SEED_ENV_VAR
from plait.trainer.metrics import held
from plait.trainer.run_state import Run
from plait.trainer.state import rng_state, set_rng_state

if TYPE_CHECKING:
    import torch

    from plait.core import Strategy
    from plait.trainer.checkpointing import Checkpointer
    from plait.trainer.limits import Stage
    from plait.trainer.metrics import Number
    from plait.trainer.module import DataModule, Module
    from plait.trainer.run_state import Attached
    from plait.trainer.trainer import Trainer

__all__ = [
    "TRAINED_CHECKPOINT",
    "Launch",
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


class Launch:
    """Runs a stage in every rank, and brings rank 0's result back to the caller's objects.

    Called by the Trainer's entry points (``fit``, ``validate``, ...); `hand_back`
    runs in each rank at the end of a fit that worked on a copy of the caller's
    module, and `outcome` is what rank 0 then sends back.

    Args:
        trainer: The trainer it launches for (the caller's, or a rank's copy of it).
        checkpointer: What saves a sharded module a fit on copies trained.

    Attributes:
        ran_as: The size of the last run's job, and this process's rank in it: a
            rank's own, or 0 in a process that took rank 0's outcome (``ddp_spawn``'s
            caller); ``None`` before any run.
    """

    def __init__(self, trainer: Trainer, checkpointer: Checkpointer) -> None:
        self._trainer = trainer
        self._checkpointer = checkpointer
        self.ran_as: tuple[int, int] | None = None
        # What a fit on a copy hands back, kept by `hand_back` for `outcome`.
        self._state_dict: dict[str, torch.Tensor] | None = None
        self._trained_checkpoint: str | None = None

    @override
    def __getstate__(self) -> dict[str, object]:
        # It travels to the ranks with its trainer: nothing of a run goes with it.
        return {**self.__dict__, "_state_dict": None, "_trained_checkpoint": None}

    def __call__(
        self,
        stage: Stage,
        model: Module,
        *,
        loaders: Iterable[object] | None,
        val_loaders: Iterable[object] | None,
        datamodule: DataModule | None,
        ckpt_path: str | None,
    ) -> object:
        """Run ``stage`` of ``model`` in every rank; rank 0's results (metrics, predictions)."""
        trainer = self._trainer
        strategy = trainer.strategy
        run = Run(
            stage=stage,
            loaders=loaders,
            val_loaders=val_loaders,
            datamodule=datamodule,
            ckpt_path=ckpt_path,
            origin=origin(model),
            # Taken up by ranks a launcher starts afresh, where the caller seeded.
            random_state=(
                rng_state(cuda=False)
                if isinstance(strategy, SupportsLauncher) and SEED_ENV_VAR in os.environ
                else None
            ),
        )
        if isinstance(strategy, SupportsLauncher):
            launcher = strategy.launcher
            if isinstance(launcher, SupportsStopTimeout):
                launcher.stop_timeout = trainer.stop_timeout  # the ranks' bound, and its own
            outcome = launcher.launch(run_in_rank, trainer, model, run)
        else:
            outcome = run_in_rank(trainer, model, run)
        return self.adopt(outcome, model)

    def begin(self) -> None:
        """A run starts in this rank: nothing is handed back yet."""
        self._state_dict = None
        self._trained_checkpoint = None

    def hand_back(self, attached: Attached, module: Module) -> None:
        """Keep what the caller's module must learn of a fit that trained a copy of it.

        The trained state, taken through the strategy while it is still set up; a
        sharded module's is saved as its shards instead, never gathered whole. Every
        rank calls it (both are collective).
        """
        trainer = self._trainer
        strategy = trainer.strategy
        if not (isinstance(strategy, SupportsShardedModule) and strategy.shards_module):
            self._state_dict = gather_module_state(strategy, module)
        elif not trainer.limits.fast_dev_run:  # a debugging run leaves nothing behind
            path = os.path.join(trainer.default_root_dir, TRAINED_CHECKPOINT)
            self._checkpointer.save(attached, path)
            self._trained_checkpoint = path

    def outcome(self, results: object) -> Outcome:
        """What rank 0 sends back at the end of a run."""
        trainer = self._trainer
        return Outcome(
            trainer=identity(trainer),
            # Kept by `hand_back` where a fit worked on a copy.
            state_dict=self._state_dict,
            trained_checkpoint=self._trained_checkpoint,
            callback_states={c.state_key: c.state_dict() for c in trainer.callbacks},
            callback_metrics=dict(trainer.callback_metrics),
            logged_metrics=dict(trainer.logged_metrics),
            progress_bar_metrics=dict(trainer.progress_bar_metrics),
            current_epoch=trainer.current_epoch,
            global_step=trainer.global_step,
            log_dir=trainer.log_dir,
            world_size=trainer.world_size,
            results=results,
        )

    def adopt(self, outcome: Outcome, model: Module) -> object:
        """Give the caller's trainer and ``model`` what rank 0 sent back; its results.

        The run may have worked on copies (in other processes): the trained state,
        the callbacks' states, the metrics and the counters come back from rank 0.
        """
        trainer = self._trainer
        trainer.trained_checkpoint_path = outcome.trained_checkpoint
        if outcome.trained_checkpoint is not None:
            rank_zero_warn(
                f"fit trained spawned copies of the module, which "
                f"{type(trainer.strategy).__name__} shards: the module passed to fit is "
                f"unchanged, and its trained state was saved, never gathered whole, at "
                f"{outcome.trained_checkpoint!r} (trainer.trained_checkpoint_path); "
                f"{type(model).__name__}.load_from_checkpoint(path) reads it whole",
                stacklevel=4,
            )
        if outcome.state_dict is not None:
            if set(outcome.state_dict) - set(model.state_dict()):
                # Layers the ranks made in configure_model: made here too.
                model.configure_model()
            model.load_state_dict(outcome.state_dict)
        if outcome.trainer != identity(trainer):
            # A copy of this trainer ran (the module may still be this one).
            for callback in trainer.callbacks:
                state = outcome.callback_states.get(callback.state_key)
                if state is not None:
                    callback.load_state_dict(state)
            results = trainer.results
            # However the outcome travelled, the values answer .item() here too.
            results.callback_metrics = {k: held(v) for k, v in outcome.callback_metrics.items()}
            results.logged_metrics = dict(outcome.logged_metrics)
            results.progress_bar_metrics = dict(outcome.progress_bar_metrics)
            results.log_dir = outcome.log_dir
            trainer.progress.current_epoch = outcome.current_epoch
            trainer.progress.global_step = outcome.global_step
            # This process answers for the job as its rank 0 did.
            self.ran_as = (outcome.world_size, 0)
        return outcome.results
