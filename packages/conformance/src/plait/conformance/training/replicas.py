"""The replicas example's rank part: train, and report the losses, replicas and export."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from plait.conformance.training.loop import (
    Loop,
    TrainingReport,
    finish,
    scratch_directory,
    seed_streams,
)

if TYPE_CHECKING:
    from plait.conformance.training.cases import TrainingCase
    from plait.core import Strategy, TrainingSemantics

__all__: list[str] = []


def _replicas(
    strategy: Strategy, case: TrainingCase, semantics: TrainingSemantics
) -> TrainingReport:
    run = case.run
    seed_streams(run, strategy.global_rank)
    try:
        loop = Loop(strategy, run, model_seed=run.seed)
        replicas: list[tuple[float, ...]] = []
        loop.begin()
        losses = loop.train(0, run.steps, replicas)
        loop.end()
        if not loop.sharded:
            replicas.append(loop.replica())
        with scratch_directory(strategy) as directory:
            export = loop.export(str(Path(directory) / "export"))
    finally:
        finish(strategy)
    return TrainingReport(
        semantics,
        losses=tuple(losses),
        replicas=None if loop.sharded else tuple(replicas),
        export=export,
    )
