"""Each stage's loop, assembled from a run's parts and the Trainer's settings, then run.

``fit`` steps through automatic or manual optimization (the user's step steps the
optimizers and schedulers itself under manual optimization: every batch ends a
step), validating as the limits say; ``validate`` and ``test`` run the evaluation
loop once; ``predict`` the prediction loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from plait.trainer.evaluation_loop import EvaluationLoop, PredictionLoop
from plait.trainer.fit_loop import FitLoop, datamodule_loader
from plait.trainer.optimization import (
    AutomaticOptimization,
    ManualOptimization,
    Optimization,
    Schedulers,
)

if TYPE_CHECKING:
    from plait.trainer.callbacks.checkpoint import ModelCheckpoint
    from plait.trainer.checkpointing import Checkpointer
    from plait.trainer.loop_settings import LoopContext
    from plait.trainer.run_state import Attached, Run

__all__ = ["run_stage_loop"]


def run_stage_loop(
    run: Run,
    attached: Attached,
    context: LoopContext,
    *,
    checkpointer: Checkpointer,
    last_checkpoint: ModelCheckpoint | None,
) -> object:
    """Run ``run``'s stage in this rank: ``None`` for fit, the metrics or predictions else."""
    stage = run.stage
    strategy, progress, results, settings = (
        context.strategy,
        context.progress,
        context.results,
        context.settings,
    )
    evaluation = EvaluationLoop(context, attached)
    if stage == "fit":
        # Under manual optimization the user's step steps the optimizers and the
        # schedulers: the trainer steps neither, and every batch ends a step.
        manual = not attached.module.automatic_optimization
        schedulers = Schedulers([] if manual else attached.schedulers, progress, results)
        optimization: Optimization = (
            ManualOptimization(strategy, attached)
            if manual
            else AutomaticOptimization(
                strategy,
                attached,
                attached.hooks,
                progress,
                schedulers,
                accumulate=settings.accumulate_grad_batches,
                clip_val=settings.gradient_clip_val,
                clip_algorithm=settings.gradient_clip_algorithm,
            )
        )
        if manual:  # every batch ends a step
            context = attrs.evolve(
                context, settings=attrs.evolve(settings, accumulate_grad_batches=1)
            )
        FitLoop(
            context,
            attached,
            optimization=optimization,
            schedulers=schedulers,
            evaluation=evaluation,
            checkpointer=checkpointer,
            last_checkpoint=last_checkpoint,
        ).run(run.loaders, run.val_loaders, run.datamodule)
        return None
    loader = run.loaders
    if loader is None:
        loader = datamodule_loader(run.datamodule, stage)
    if stage == "predict":
        return PredictionLoop(context, attached).run(loader)
    return [evaluation.run(stage, loader)]
