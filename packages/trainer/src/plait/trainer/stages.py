"""Each stage's loop, assembled from a run's parts and the Trainer's settings, then run.

``fit`` steps through automatic or manual optimization (the user's step steps the
optimizers and schedulers itself under manual optimization: every batch ends a
step), validating as the limits say; ``validate`` and ``test`` run the evaluation
loop once; ``predict`` the prediction loop.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
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
    from plait.core import GradientClipAlgorithm, Strategy
    from plait.trainer.attach import Attached, Run
    from plait.trainer.callbacks.checkpoint import ModelCheckpoint
    from plait.trainer.checkpointing import Checkpointer
    from plait.trainer.limits import Limits
    from plait.trainer.progress import Progress
    from plait.trainer.results import Results

__all__ = ["LoopSettings", "run_stage_loop"]


@attrs.frozen
class LoopSettings:
    """What the Trainer's arguments say of how ``fit`` steps."""

    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: GradientClipAlgorithm
    stop_signals: tuple[signal.Signals, ...]
    stop_timeout: float | None
    detect_anomaly: bool


def run_stage_loop(
    run: Run,
    attached: Attached,
    *,
    strategy: Strategy,
    progress: Progress,
    results: Results,
    limits: Limits,
    checkpointer: Checkpointer,
    last_checkpoint: ModelCheckpoint | None,
    settings: LoopSettings,
    sanity: Callable[[], contextlib.AbstractContextManager[None]],
) -> object:
    """Run ``run``'s stage in this rank: ``None`` for fit, the metrics or predictions else."""
    stage = run.stage
    evaluation = EvaluationLoop(strategy, attached, results, limits, progress)
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
        FitLoop(
            strategy=strategy,
            attached=attached,
            optimization=optimization,
            schedulers=schedulers,
            evaluation=evaluation,
            results=results,
            limits=limits,
            progress=progress,
            checkpointer=checkpointer,
            last_checkpoint=last_checkpoint,
            stop_signals=settings.stop_signals,
            stop_timeout=settings.stop_timeout,
            accumulate=1 if manual else settings.accumulate_grad_batches,
            detect_anomaly=settings.detect_anomaly,
            sanity=sanity,
        ).run(run.loaders, run.val_loaders, run.datamodule)
        return None
    loader = run.loaders
    if loader is None:
        loader = datamodule_loader(run.datamodule, stage)
    if stage == "predict":
        return PredictionLoop(strategy, attached, results, limits, progress).run(loader)
    return [evaluation.run(stage, loader)]
