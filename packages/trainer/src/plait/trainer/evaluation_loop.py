"""The loops that run the module without training it: validate, test and predict."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

import torch

from plait.precision import map_tensors
from plait.trainer.batches import evaluation_loader, even_batches
from plait.trainer.data import length
from plait.trainer.gather import gather_objects
from plait.trainer.metric_objects import states_kept
from plait.trainer.metrics import Metrics, Number
from plait.trainer.state import to_device

if TYPE_CHECKING:
    from plait.trainer.loop_settings import LoopContext
    from plait.trainer.results import Results
    from plait.trainer.run_state import Attached

__all__ = ["EvaluationLoop", "PredictionLoop", "kept"]

_CPU = torch.device("cpu")


def kept(output: object) -> object:
    """A step's output as a prediction is kept: complete, and on the CPU.

    A module parallelized with tensor parallelism returns tensors whose collective
    may still be running (torch's ``AsyncCollectiveTensor``, waited for by the next
    operation on it); a prediction is pickled to be gathered, which reads its memory
    directly, so it is waited for here. A copy from an accelerator is made
    blocking: the prediction is read as soon as it is kept.
    """

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        if type(tensor) is not torch.Tensor:
            from torch.distributed._functional_collectives import (  # noqa: PLC0415
                AsyncCollectiveTensor,
            )

            if isinstance(tensor, AsyncCollectiveTensor):
                tensor = tensor.wait()
        return tensor if tensor.device == _CPU else tensor.to(_CPU)

    return map_tensors(output, keep)


class _RunsSteps:
    """A loop that runs the module's steps over a loader, every rank as many."""

    def __init__(self, context: LoopContext, attached: Attached) -> None:
        self.strategy = context.strategy
        self.attached = attached
        self.results = context.results
        self.limits = context.limits
        self.progress = context.progress


class EvaluationLoop(_RunsSteps):
    """Runs a validation or test loop once over a loader, and folds what it logged.

    Every rank runs as many forwards (through the wrapper, whose forward may be
    collective: FSDP's is); a rank with fewer batches pads with a forward whose
    output, logged values and hooks are dropped, so that every sample counts once.

    Args:
        context: The strategy (which runs the steps and folds the values over the
            ranks), where logged values go, how many batches each stage runs, and
            where the number of batches is shown.
        attached: The run's module and wrapper.
    """

    def run(
        self,
        stage: Literal["validate", "test"],
        loader: Iterable[object],
        *,
        batches: int | None = None,
        publish: bool = True,
    ) -> dict[str, Number]:
        """The stage's metrics, folded over the ranks where logged with ``sync_dist``.

        ``batches`` runs at most that many (a sanity check's); without ``publish``
        nothing logged reaches the callbacks or the loggers.
        """
        strategy, attached, results = self.strategy, self.attached, self.results
        steps, wrapped, hooks = attached.steps, attached.wrapped, attached.hooks
        prepared = evaluation_loader(strategy, loader)
        total = self.limits.batches_of(stage, length(prepared))
        if batches is not None:
            total = batches if total is None else min(total, batches)
        self.progress.eval_batches = total if total is not None else 0
        metrics = Metrics(stage=stage, training=False)
        results.active = metrics
        attached.module.eval()
        hooks.on_evaluation_start(stage)
        # Through the wrapper, whose forward may be collective (FSDP's is): every
        # rank runs as many forwards, the ranks with fewer batches padding.
        steps.stage = stage
        step = strategy.validation_step if stage == "validate" else strategy.test_step
        region = hooks.profiler.region
        step_name = "validation_step" if stage == "validate" else "test_step"
        for batch_idx, batch, real in even_batches(strategy, prepared, total):
            on_device = to_device(batch, strategy.root_device)
            if not real:
                _pad(results, attached.module, step, wrapped, on_device, batch_idx=batch_idx)
                continue
            results.current_batch = on_device
            with region(step_name):
                output = step(wrapped, on_device, batch_idx)
            hooks.on_evaluation_batch_end(stage, output, on_device, batch_idx)
        hooks.on_evaluation_epoch_end(stage)
        values = results.publish_epoch(metrics, training=False) if publish else {}
        hooks.on_evaluation_end(stage)
        results.active = None
        steps.stage = "fit"
        return values


class PredictionLoop(_RunsSteps):
    """Runs ``predict_step`` over a loader; the outputs of every rank, in the loader's order.

    Args:
        context: The strategy (which runs the steps and gathers the outputs), where
            values logged while padding are dropped, how many batches to predict,
            and where the number of batches is shown.
        attached: The run's module and wrapper.
    """

    def run(self, loader: Iterable[object]) -> list[object]:
        """Every batch's prediction, on the CPU, in the loader's order (all ranks' together)."""
        strategy, attached, results = self.strategy, self.attached, self.results
        steps, wrapped, hooks = attached.steps, attached.wrapped, attached.hooks
        prepared = evaluation_loader(strategy, loader)
        total = self.limits.batches_of("predict", length(prepared))
        self.progress.eval_batches = total if total is not None else 0
        attached.module.eval()
        hooks.on_predict_start()
        steps.stage = "predict"
        outputs: list[object] = []
        for batch_idx, batch, real in even_batches(strategy, prepared, total):
            on_device = to_device(batch, strategy.root_device)
            if not real:
                _pad(
                    results,
                    attached.module,
                    strategy.predict_step,
                    wrapped,
                    on_device,
                    batch_idx=batch_idx,
                )
                continue
            results.current_batch = on_device
            with hooks.profiler.region("predict_step"):
                output = strategy.predict_step(wrapped, on_device, batch_idx)
            outputs.append(kept(output))
            hooks.on_predict_batch_end(output, on_device, batch_idx)
        hooks.on_predict_end()
        if strategy.world_size == 1:
            return outputs
        # Each data-parallel rank predicted a contiguous block: in rank order, they
        # are the loader's order (ranks that read the same data predicted alike).
        mine = (strategy.layout.data_parallel_rank, outputs)
        blocks: dict[int, list[object]] = {}
        for shard, share in gather_objects(strategy, mine):
            blocks.setdefault(shard, share)
        return [output for shard in sorted(blocks) for output in blocks[shard]]


def _pad(
    results: Results,
    module: torch.nn.Module,
    step: Callable[..., object],
    wrapped: torch.nn.Module,
    batch: object,
    *,
    batch_idx: int,
) -> None:
    # A forward that keeps this rank in step with ranks holding more batches: its
    # output, its logged values, its hooks and what it adds to the module's metric
    # objects (torchmetrics') are dropped, so that every sample counts once.
    with results.discarding(), states_kept(module):
        step(wrapped, batch, batch_idx)
