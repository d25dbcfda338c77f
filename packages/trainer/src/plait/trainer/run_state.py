"""The run state of one rank: what a run is asked to do, and what it holds while it runs.

`Run` travels to the ranks; `Attached` is what one rank holds from set-up to
teardown (`plait.trainer.attach` makes it); `Steps` routes the strategy's wrapper to
the user module's step of the current stage. The loops, the Trainer and the module
read them; at run time this module imports nothing of the Trainer's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final

import attrs
import torch
from typing_extensions import override

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint
    from plait.trainer.hooks import Hooks
    from plait.trainer.limits import Stage
    from plait.trainer.module import DataModule, Module
    from plait.trainer.optim import SchedulerConfig
    from plait.trainer.optimization import TrainerOptimizer

__all__ = ["Attached", "Run", "Steps", "steps_of"]

_STEP_METHODS: Final[dict[str, str]] = {
    "fit": "training_step",
    "validate": "validation_step",
    "test": "test_step",
    "predict": "predict_step",
}


@attrs.frozen
class Run:
    """What a run is asked to do, as it travels to the ranks.

    Attributes:
        stage: What the run does.
        loaders: The loaders given to the entry point (training or evaluation).
        val_loaders: The validation loaders given to ``fit``.
        datamodule: The data module, when the loaders come from one.
        ckpt_path: The checkpoint to start from, resolved to a path.
        origin: The calling process and module, to tell a run on copies.
        random_state: The caller's random states (Python's, torch's on the CPU,
            NumPy's) when it seeded them: a rank started afresh takes them up, so
            that it draws what a rank that ran the caller's program would.
    """

    stage: Stage
    loaders: Iterable[object] | None
    val_loaders: Iterable[object] | None
    datamodule: DataModule | None
    ckpt_path: str | None
    origin: tuple[int, int]
    random_state: Mapping[str, object] | None = None


class Steps(torch.nn.Module):
    """Routes the wrapper's forward to the user module's step of the current stage.

    The strategy wraps this (in DDP, say), so that a training step runs through the
    wrapper's forward and its gradient synchronisation.
    """

    def __init__(self, module: Module) -> None:
        super().__init__()
        self.module = module
        self.stage: Stage = "fit"

    @override
    def forward(self, batch: object, batch_idx: int) -> object:
        """The current stage's step of the user module."""
        # Read from the instance's dict: a submodule's lookup (self.module) is slow.
        step = getattr(self.__dict__["_modules"]["module"], _STEP_METHODS[self.stage])
        return step(batch, batch_idx)


_STEPS: Final = "_plait_steps"


def steps_of(module: Module) -> Steps:
    """The module's `Steps`: made at its first run, and the same for every later one.

    A sharding strategy shards the steps as its root, the module's own parameters
    with it: the next run of the job (``test`` after ``fit``) goes on with the root
    that holds them.
    """
    steps = module.__dict__.get(_STEPS)
    if not isinstance(steps, Steps):
        steps = Steps(module)
        # Not a submodule (the module would contain itself): a plain attribute.
        object.__setattr__(module, _STEPS, steps)
    return steps


@attrs.define
class Attached:
    """What one run holds in one rank, from set-up to teardown.

    Attributes:
        module: The user's module.
        steps: The module's steps, as the strategy wrapped them.
        wrapped: The strategy's wrapper around ``steps`` (DDP's, FSDP's, ...).
        optimizers: The optimizers as set up (the strategy's twins, where it has them).
        schedulers: The learning-rate schedulers, each driving its optimizer's twin.
        hooks: The run's callbacks and module hooks.
        handles: The optimizers as `Module.optimizers` returns them.
        checkpoint: The checkpoint the run started from, loaded already.
        datamodule: The run's data module, when the user gave one.
    """

    module: Module
    steps: Steps
    wrapped: torch.nn.Module
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[SchedulerConfig]
    hooks: Hooks
    handles: list[TrainerOptimizer]
    checkpoint: Checkpoint | None
    datamodule: DataModule | None = None
