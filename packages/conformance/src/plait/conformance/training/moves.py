"""The moves' rank parts: train, save and go on; load a moved checkpoint and go on."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from plait.conformance.training.loop import (
    FRESH_SEED,
    Loop,
    TrainingReport,
    finish,
    seed_streams,
    shared_directory,
)

if TYPE_CHECKING:
    from plait.conformance.training.cases import TrainingCase
    from plait.core import Strategy, TrainingSemantics

__all__: list[str] = []


def _move_out(
    strategy: Strategy, case: TrainingCase, semantics: TrainingSemantics
) -> TrainingReport:
    run = case.run
    seed_streams(run, strategy.global_rank)
    try:
        loop = Loop(strategy, run, model_seed=run.seed)
        loop.begin()
        loop.train(0, case.stop_at)
        directory = shared_directory(strategy, "plait-kit-move-")
        path = str(Path(directory) / "checkpoint")
        strategy.save_checkpoint(loop.state(), path)
        strategy.barrier()
        after = loop.train(case.stop_at, run.steps)
        loop.end()
    finally:
        finish(strategy)
    return TrainingReport(semantics, losses=tuple(after), checkpoint=path)


def _move_in(
    strategy: Strategy, case: TrainingCase, semantics: TrainingSemantics
) -> TrainingReport:
    run = case.run
    assert case.source is not None
    torch.manual_seed(FRESH_SEED + strategy.global_rank)
    try:
        loop = Loop(strategy, run, model_seed=run.seed + FRESH_SEED)
        loop.restore(case.source)
        loop.begin()
        after = loop.train(case.stop_at, run.steps)
        loop.end()
    finally:
        finish(strategy)
    return TrainingReport(semantics, losses=tuple(after))
