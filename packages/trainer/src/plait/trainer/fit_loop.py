"""The fit loop: epochs of training batches, validation at its cadence, and every way to stop."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from plait.core import TrainingStopped, rank_zero_warn
from plait.trainer.batches import agreed_total, batches
from plait.trainer.data import length, prepare_loader, sampler_seed, set_epoch
from plait.trainer.metrics import Metrics, metric_group
from plait.trainer.module import overrides
from plait.trainer.optimization import is_step_batch
from plait.trainer.profiler import regions_of
from plait.trainer.progress import Resume
from plait.trainer.state import preserved_rng, set_rng_state, to_device
from plait.trainer.stopping import GracefulStop

if TYPE_CHECKING:
    import signal

    from plait.trainer.callbacks.checkpoint import ModelCheckpoint
    from plait.trainer.checkpointing import Checkpointer
    from plait.trainer.evaluation_loop import EvaluationLoop
    from plait.trainer.loop_settings import LoopContext
    from plait.trainer.module import DataModule
    from plait.trainer.optimization import Optimization, Schedulers
    from plait.trainer.run_state import Attached

__all__ = ["FitLoop", "datamodule_loader"]


def datamodule_loader(datamodule: DataModule | None, stage: str) -> Iterable[object]:
    """The data module's loader for ``stage``."""
    assert datamodule is not None  # checked before the run
    method = {
        "fit": datamodule.train_dataloader,
        "validate": datamodule.val_dataloader,
        "test": datamodule.test_dataloader,
        "predict": datamodule.predict_dataloader,
    }[stage]
    return method()


class FitLoop:
    """Trains until a limit is reached, a callback asks to stop, or a stop signal comes.

    It holds no state that outlives the run: the counters are `Progress`'s, and it
    moves them on. Every rank runs it alike; wherever the ranks could differ (the
    number of batches, a stop asked by one of them) they agree first.

    Args:
        context: The strategy, the counters, the results, the limits and the settings.
        attached: The run's module and parts.
        optimization: Runs each training batch and its optimizer steps.
        schedulers: The epoch's schedulers are stepped at its end.
        evaluation: Runs validation inside training.
        checkpointer: Restores the run's checkpoint, and writes ``last.ckpt`` when a
            stop signal comes.
        last_checkpoint: The `ModelCheckpoint` that names ``last.ckpt``, if any.
    """

    def __init__(
        self,
        context: LoopContext,
        attached: Attached,
        *,
        optimization: Optimization,
        schedulers: Schedulers,
        evaluation: EvaluationLoop,
        checkpointer: Checkpointer,
        last_checkpoint: ModelCheckpoint | None,
    ) -> None:
        settings = context.settings
        self.strategy = strategy = context.strategy
        self.attached = attached
        self.optimization = optimization
        self.schedulers = schedulers
        self.evaluation = evaluation
        self.results = context.results
        self.limits = context.limits
        self.progress = context.progress
        self.checkpointer = checkpointer
        self.last_checkpoint = last_checkpoint
        self.stop_signals = settings.stop_signals
        self.stop_timeout = settings.stop_timeout
        self.accumulate = settings.accumulate_grad_batches
        self.detect_anomaly = settings.detect_anomaly
        self.sanity = context.sanity
        self._graceful: GracefulStop | None = None
        self._stopping: signal.Signals | None = None
        self._step_sync = False
        self._world_size = strategy.world_size  # read per batch: a property may be slow
        self._metric_group = metric_group(strategy.layout)

    def run(
        self,
        loaders: Iterable[object] | None,
        val_loaders: Iterable[object] | None,
        datamodule: DataModule | None,
    ) -> None:
        """Train from where the run's checkpoint left off (or from the start)."""
        strategy, attached, progress = self.strategy, self.attached, self.progress
        module, checkpoint = attached.module, attached.checkpoint
        train = loaders if loaders is not None else datamodule_loader(datamodule, "fit")
        validate_with = val_loaders
        if validate_with is None and datamodule is not None and datamodule.has("val_dataloader"):
            validate_with = datamodule.val_dataloader()
        if validate_with is not None and not overrides(module, "validation_step"):
            rank_zero_warn("validation data was given, but the module has no validation_step")
            validate_with = None
        # The order of every epoch follows from this seed: a resumed run keeps it.
        progress.sampler_seed = (
            int(checkpoint["loops"].get("sampler_seed", 0)) if checkpoint else sampler_seed()
        )
        layout = strategy.layout
        train_loader = prepare_loader(
            train,
            training=True,
            rank=layout.data_parallel_rank,
            world_size=layout.data_parallel_size,
            seed=progress.sampler_seed,
            shuffle=False if self.limits.in_order else None,
        )
        val_loader = (
            None
            if validate_with is None
            else prepare_loader(
                validate_with,
                training=False,
                rank=layout.data_parallel_rank,
                world_size=layout.data_parallel_size,
            )
        )
        resume = Resume() if checkpoint is None else self.checkpointer.restore(attached, checkpoint)
        module.train()
        attached.hooks.on_fit_start()
        if val_loader is not None and self.limits.sanity_batches:
            self._sanity_check(val_loader)
        self._stopping = None
        anomalies = (
            torch.autograd.detect_anomaly() if self.detect_anomaly else contextlib.nullcontext()
        )
        with GracefulStop(self.stop_signals, self.stop_timeout) as graceful, anomalies:
            self._graceful = graceful
            attached.hooks.on_train_start()
            try:
                while not self.limits.done(progress):
                    with attached.hooks.profiler.region("run_training_epoch"):
                        self._epoch(train_loader, val_loader, resume)
                    resume = Resume()
            finally:
                self._graceful = None
            attached.hooks.on_train_end()
        attached.hooks.on_fit_end()

    def _epoch(
        self, loader: Iterable[object], val_loader: Iterable[object] | None, resume: Resume
    ) -> None:
        progress, limits, hooks = self.progress, self.limits, self.attached.hooks
        set_epoch(loader, progress.current_epoch)
        total = agreed_total(self.strategy, limits.batches_of("fit", length(loader)))
        progress.training_batches = total if total is not None else 0
        metrics = Metrics(stage="fit", training=True)
        if resume.metrics is not None:
            metrics.load_state_dict(resume.metrics)
        self.results.active = metrics
        progress.epoch_done = False
        progress.batches_done = resume.start_batch
        hooks.on_train_epoch_start()
        if resume.rng is not None and resume.start_batch == 0:
            set_rng_state(resume.rng)
        batch_iterator = batches(self.strategy, loader, total)
        for _ in range(resume.start_batch):
            next(batch_iterator, None)
        if resume.rng is not None and resume.start_batch > 0:
            set_rng_state(resume.rng)
        val_every = limits.validation_every(total)
        validated_at_end = False
        profiler = self.attached.hooks.profiler
        regions = regions_of(profiler)
        device = self.strategy.root_device
        ran_out = True
        for batch_idx, batch in batch_iterator:
            if regions is None:  # no profiler: no context around the batch
                self._batch(metrics, batch_idx, batch, device)
            else:
                with regions("run_training_batch"):
                    self._batch(metrics, batch_idx, batch, device)
                profiler.step()
            last = total is not None and batch_idx + 1 == total
            due = val_every is not None and ((batch_idx + 1) % val_every == 0 or last)
            if val_loader is not None and limits.validation_due(progress) and due:
                self._validate(val_loader)
                validated_at_end = last
            self._stop_if_asked(batch_idx)
            if limits.steps_reached(progress):
                ran_out = False
                break
        at_end = val_every is None and not validated_at_end
        if val_loader is not None and limits.validation_due(progress) and at_end:
            self._validate(val_loader)
        self._end_epoch(metrics, ran_out=ran_out)

    def _batch(self, metrics: Metrics, batch_idx: int, batch: object, device: torch.device) -> None:
        # The hottest code of the trainer: attributes are read once, into locals.
        strategy, attached, progress, results = (
            self.strategy,
            self.attached,
            self.progress,
            self.results,
        )
        hooks, steps = attached.hooks, attached.steps
        results.current_batch = on_device = to_device(batch, device)
        results.active = metrics
        metrics.start_step()
        if hooks.runs_batch_start:
            hooks.on_train_batch_start(on_device, batch_idx)
        stepping = is_step_batch(batch_idx, self.accumulate, progress.training_batches)
        if steps.stage != "fit":  # set only after validation: a Module's setattr is slow
            steps.stage = "fit"
        output = self.optimization.run(on_device, batch_idx, stepping=stepping)
        progress.batches_done = batch_idx + 1
        # Agreed at each epoch's first batch, then at every batch while any rank
        # syncs step values: a metric synced on one rank only fails at once.
        self._step_sync = metrics.sync_step(
            strategy,
            self._world_size,
            required=self._step_sync or batch_idx == 0,
            group=self._metric_group,
        )
        results.publish_step(metrics, stepping=stepping)
        if hooks.runs_batch_end:
            hooks.on_train_batch_end(output, on_device, batch_idx)

    def _end_epoch(self, metrics: Metrics, *, ran_out: bool) -> None:
        progress, results, hooks = self.progress, self.results, self.attached.hooks
        results.active = metrics
        metrics.epoch_end = True
        hooks.on_train_epoch_end_module()
        results.publish_epoch(metrics, training=True)
        results.active = None
        # An epoch cut short by max_steps is not over: its schedulers step when a
        # resumed run finishes it, once (a checkpoint written now must not hold them
        # stepped already).
        progress.epoch_done = ran_out or progress.batches_done >= progress.training_batches > 0
        if progress.epoch_done:
            self.schedulers.step("epoch")
        hooks.on_train_epoch_end()
        # Any rank may have asked to stop: all stop together, or none does.
        progress.should_stop = self.strategy.reduce_boolean_decision(
            progress.should_stop, all=False
        )
        progress.current_epoch += 1

    def _sanity_check(self, loader: Iterable[object]) -> None:
        # A few validation batches before training, to fail early on a broken
        # validation_step: nothing they log counts, and training's random stream and
        # metrics are untouched.
        count = self.limits.sanity_batches
        batches = None if count < 0 else count
        with self.sanity(), preserved_rng(), self.attached.hooks.profiler.region("sanity_check"):
            self.evaluation.run("validate", loader, batches=batches, publish=False)
        self.results.active = None
        self.attached.module.train()

    def _validate(self, loader: Iterable[object]) -> None:
        # Validation must not shift training's random stream (nor its metrics).
        training_metrics = self.results.active
        with preserved_rng(), self.attached.hooks.profiler.region("run_validation"):
            self.evaluation.run("validate", loader)
        self.results.active = training_metrics
        self.attached.module.train()

    def _stop_if_asked(self, batch_idx: int) -> None:
        # Every rank, after every training batch: the ranks agree (every few batches)
        # whether a stop signal came to any of them, then stop together at the first
        # batch that ends with an optimizer step (accumulated gradients are not saved).
        graceful = self._graceful
        if graceful is None:
            return
        strategy, progress = self.strategy, self.progress
        agreed = graceful.after_batch(strategy, self._world_size)
        if agreed is not None and self._stopping is None:
            self._stopping = agreed
        if self._stopping is None or not is_step_batch(
            batch_idx, self.accumulate, progress.training_batches
        ):
            return
        callback = self.last_checkpoint
        path = callback.last_path() if callback is not None else None
        if callback is not None and path is not None:
            callback.last_model_path = path
            self.checkpointer.save(self.attached, path)
        stopped = TrainingStopped(self._stopping, path, progress.global_step)
        if strategy.is_global_zero:
            sys.stderr.write(f"plait: {stopped.describe()}\n")
            sys.stderr.flush()
        raise stopped
