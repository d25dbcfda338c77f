"""The resume's rank part: stop, resume in a fresh strategy, compare with the run never stopped."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from plait.conformance.training.compare import (
    close_states,
    compare_losses,
    compare_vectors,
    tolerance,
)
from plait.conformance.training.loop import (
    FRESH_SEED,
    Loop,
    TrainingReport,
    build_strategy,
    finish,
    seed_streams,
    shared_directory,
)

if TYPE_CHECKING:
    from plait.conformance.target import StrategyTarget
    from plait.conformance.training.cases import TrainingCase, TrainingRun
    from plait.core import Strategy, TrainingSemantics

__all__: list[str] = []


def _resume(
    first: Strategy, target: StrategyTarget, case: TrainingCase, semantics: TrainingSemantics
) -> TrainingReport:
    run = case.run
    rank = first.global_rank
    directory = shared_directory(first, "plait-kit-")
    path = str(Path(directory) / "checkpoint")
    last: Strategy = first
    try:
        expected, expected_replica, expected_export = _never_stopped(first, run, directory)
        # The run stopped after stop_at steps (and stop_inside micro-batches).
        last = stopped_strategy = build_strategy(target, run, case.checkpoint_io)
        seed_streams(run, rank)
        try:
            stopped = Loop(stopped_strategy, run, model_seed=run.seed)
            stopped.begin()
            before = stopped.train(0, case.stop_at)
            if case.stop_inside and case.stop_at < run.steps:
                stopped.window(case.stop_at, case.stop_inside)
            stopped_strategy.save_checkpoint(stopped.state(), path)
            stopped_strategy.barrier()
        finally:
            finish(stopped_strategy)
        # The same run resumed in a fresh strategy, from a model that starts elsewhere.
        last = resumed_strategy = build_strategy(target, run, case.checkpoint_io)
        # A new run starts once the stopped one has ended (its writes finished).
        resumed_strategy.barrier()
        torch.manual_seed(FRESH_SEED + rank)
        try:
            resumed = Loop(resumed_strategy, run, model_seed=run.seed + FRESH_SEED)
            resumed.restore(path)
            resumed.begin()
            after = resumed.train(case.stop_at, run.steps)
            resumed.end()
            found_replica = None if resumed.sharded else resumed.replica()
            found_export = resumed.export(str(Path(directory) / "resumed"))
        finally:
            finish(resumed_strategy)
    finally:
        _remove(last, directory)
    stop = f"stopped after {case.stop_at} steps" + (
        f" and {case.stop_inside} micro-batches of the next window" if case.stop_inside else ""
    )
    exact = semantics.exact_resume
    close = None if exact else tolerance(run.precision, run.optimizer)
    problems = compare_losses(expected, before + after, stop, close=close)
    if expected_replica is not None and found_replica is not None:
        problems += compare_vectors(
            expected_replica, found_replica, f"{stop} and resumed, this rank's module", close
        )
    if expected_export is not None and found_export is not None:
        problems += [
            f"{stop} and resumed, the exported module{problem.removeprefix('the value')}"
            for problem in close_states(expected_export, found_export, close=close)
        ]
    return TrainingReport(semantics, losses=tuple(before + after), problems=tuple(problems))


def _never_stopped(
    strategy: Strategy, run: TrainingRun, directory: str
) -> tuple[list[float], tuple[float, ...] | None, dict[str, torch.Tensor] | None]:
    """The run's losses, this rank's module and the export, never stopped."""
    seed_streams(run, strategy.global_rank)
    try:
        whole = Loop(strategy, run, model_seed=run.seed)
        whole.begin()
        losses = whole.train(0, run.steps)
        whole.end()
        replica = None if whole.sharded else whole.replica()
        return losses, replica, whole.export(str(Path(directory) / "whole"))
    finally:
        finish(strategy)


def _remove(strategy: Strategy, directory: str) -> None:
    """Rank 0 removes ``directory`` once every rank is done with it."""
    with contextlib.suppress(Exception):
        strategy.barrier()
    if strategy.global_rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
