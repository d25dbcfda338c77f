"""The loops a trainer runs in every rank: fit (with validation), validate, test, predict."""

from __future__ import annotations

import abc
import contextlib
import math
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

import attrs
import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau
from typing_extensions import override

from plait.core import (
    CheckpointError,
    ConfigurationError,
    GradientClipAlgorithm,
    Strategy,
    SupportsModelShardedContext,
    SupportsProcessDataloader,
    TrainingStopped,
    rank_zero_warn,
)
from plait.trainer.data import length, limit_batches, prepare_loader, sampler_seed, set_epoch
from plait.trainer.gather import gather_objects
from plait.trainer.metrics import Metrics, Number
from plait.trainer.module import overrides
from plait.trainer.optim import parse_optimizers
from plait.trainer.state import (
    preserved_rng,
    rng_state,
    set_rng_state,
    to_device,
)
from plait.trainer.stopping import GracefulStop

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike
    from plait.trainer.callbacks.base import Callback
    from plait.trainer.loggers import Logger
    from plait.trainer.module import DataModule, Module, StepOutput
    from plait.trainer.optim import SchedulerConfig
    from plait.trainer.trainer import Trainer

__all__ = ["CHECKPOINT_FORMAT", "Loops", "Run", "Stage"]

Stage: TypeAlias = Literal["fit", "validate", "test", "predict"]
"""What a run does."""

CHECKPOINT_FORMAT: Final = 1
"""The layout version of the checkpoints the trainer writes."""

_STEP_METHODS: Final[dict[str, str]] = {
    "fit": "training_step",
    "validate": "validation_step",
    "test": "test_step",
    "predict": "predict_step",
}


@attrs.frozen
class Resume:
    """Where the first epoch of a resumed run starts.

    Attributes:
        start_batch: Batches of the epoch already run (skipped, in the same order).
        rng: This rank's random states, restored when training goes on.
        metrics: The epoch's logged values so far.
    """

    start_batch: int = 0
    rng: dict[str, object] | None = None
    metrics: dict[str, object] | None = None


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
    """

    stage: Stage
    loaders: Iterable[object] | None
    val_loaders: Iterable[object] | None
    datamodule: DataModule | None
    ckpt_path: str | None
    origin: tuple[int, int]


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


def _loss(output: StepOutput, world_size: int) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        loss = output.get("loss")
        if isinstance(loss, torch.Tensor):
            return loss
        raise ConfigurationError(
            f"training_step returned a mapping whose 'loss' is {type(loss).__name__}",
            value=sorted(output),
            fix="return the loss tensor, or a dict with a 'loss' tensor",
        )
    if output is None:
        if world_size > 1:
            raise ConfigurationError(
                "training_step returned None (skip this batch) on one rank of several: "
                "the others would wait for its gradients forever",
                fix="return a loss on every rank; to skip a batch, return loss * 0",
            )
        return None
    raise ConfigurationError(
        f"training_step returned a {type(output).__name__}",
        value=output,
        fix="return the loss tensor, a dict with 'loss', or None to skip the batch",
    )


class Loops(abc.ABC):
    """The loops, run inside each rank by `Trainer`; see `Trainer` for the settings."""

    current_epoch: int
    global_step: int
    should_stop: bool
    state_stage: Stage | None
    callback_metrics: dict[str, Number]
    logged_metrics: dict[str, Number]
    progress_bar_metrics: dict[str, Number]
    optimizers: list[torch.optim.Optimizer]
    lr_schedulers: list[SchedulerConfig]
    num_training_batches: int
    num_eval_batches: int
    callbacks: list[Callback]
    loggers: list[Logger]
    limits: dict[Stage, int | float]
    max_epochs: int | None
    max_steps: int
    val_check_interval: int | float
    check_val_every_n_epoch: int
    log_every_n_steps: int
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: GradientClipAlgorithm
    deterministic: bool
    checkpoint_timeout: timedelta
    stop_signals: tuple[signal.Signals, ...]
    default_root_dir: str
    _active_metrics: Metrics | None
    _world_size: int = 1
    _final_state: dict[str, torch.Tensor] | None = None
    _current_batch: object
    _steps: Steps | None
    _wrapped: torch.nn.Module | None
    _batches_done: int
    _epoch_done: bool
    _sampler_seed: int
    _graceful: GracefulStop | None = None
    _step_sync: bool = False
    _stopping: signal.Signals | None = None

    @property
    def me(self) -> Trainer:
        """This object as the `Trainer` it is (hooks take the trainer)."""
        return self  # type: ignore[return-value] # a Loops is always a Trainer

    @property
    @abc.abstractmethod
    def strategy(self) -> Strategy:
        """The strategy."""

    @property
    @abc.abstractmethod
    def is_global_zero(self) -> bool:
        """Whether this is global rank 0."""

    @abc.abstractmethod
    def log_to_loggers(self, metrics: Mapping[str, Number], step: int | None = None) -> None:
        """Send metrics to the loggers."""

    # One run.

    def run_stage(self, module: Module, run: Run) -> object:
        """Set up this rank, run the stage, and tear down, whatever happens."""
        strategy = self.strategy
        stage, datamodule = run.stage, run.datamodule
        self.state_stage = stage
        self._final_state = None
        self._wrapped = None
        self._steps = None
        module._trainer = self.me
        status = "failed"
        try:
            strategy.setup_environment()
            if self.deterministic:
                torch.use_deterministic_algorithms(mode=True)
            if datamodule is not None:
                if strategy.is_global_zero:
                    datamodule.prepare_data()
                strategy.barrier("prepare_data")
                datamodule.setup(stage)
            for callback in self.callbacks:
                callback.setup(self.me, module, stage)
            results = self._dispatch(module, run)
            # Where the run worked on a copy, the caller's module gets this state: taken
            # through the strategy (gathered, if sharded) while it is still set up, on
            # every rank of several alike (the gathering may be collective).
            if self._world_size > 1 or (os.getpid(), id(module)) != run.origin:
                self._final_state = self._gather_module_state(module)
            status = "success"
            return results
        except BaseException as error:
            for callback in self.callbacks:
                callback.on_exception(self.me, module, error)
            # The strategy may raise a clearer error in its place (naming the ranks
            # a timed-out collective waited for, say).
            strategy.on_exception(error)
            raise
        finally:
            for callback in self.callbacks:
                callback.teardown(self.me, module, stage)
            if self.is_global_zero:
                for logger in self.loggers:
                    logger.finalize(status)
            self._active_metrics = None
            self._current_batch = None
            module._trainer = None
            self._release_wrapper()
            strategy.teardown()

    def _gather_module_state(self, module: Module) -> dict[str, torch.Tensor]:
        state = self.strategy.get_state_dict(module)["state_dict"]
        gathered = {}
        for key, value in state.items():
            # A sharded tensor (a DTensor) is gathered whole, on every rank alike.
            whole = getattr(value, "full_tensor", None)
            gathered[key] = (whole() if callable(whole) else value).detach().cpu()
        return gathered

    def _release_wrapper(self) -> None:
        # Only the strategy holds the wrapper after this: it releases it (while it
        # still holds its process group) in its teardown.
        self._wrapped = None
        self._steps = None
        self.optimizers = []
        self.lr_schedulers = []

    def _dispatch(self, module: Module, run: Run) -> object:
        strategy = self.strategy
        self._world_size = strategy.world_size
        stage, loaders, datamodule = run.stage, run.loaders, run.datamodule
        # Layers made here may be created on the meta device (a sharding strategy's
        # context), to be materialised shard by shard at set-up.
        context = (
            strategy.model_sharded_context()
            if isinstance(strategy, SupportsModelShardedContext)
            else contextlib.nullcontext()
        )
        with context:
            module.configure_model()
        optimizers, schedulers = (
            parse_optimizers(module.configure_optimizers()) if stage == "fit" else ([], [])
        )
        # Module and optimizers are set up in one call: a strategy may need both at
        # once (DeepSpeed), or replace the parameters the optimizers hold (sharding).
        self._steps = Steps(module)
        self._wrapped, prepared = strategy.setup_module_and_optimizers(self._steps, optimizers)
        for config in schedulers:
            # The strategy may stand a twin in for an optimizer (sharding, averaging):
            # the scheduler must drive the twin.
            config.scheduler.optimizer = prepared[
                [id(o) for o in optimizers].index(id(config.optimizer))
            ]
        self.optimizers, self.lr_schedulers = prepared, schedulers
        checkpoint = None
        if run.ckpt_path:
            # Read after set-up: a checkpoint IO that loads in place fills the module's
            # own (possibly sharded) tensors, each rank reading only what it holds.
            checkpoint = strategy.read_checkpoint(run.ckpt_path, module)
            self._check_checkpoint(checkpoint, run.ckpt_path)
            module.on_load_checkpoint(checkpoint)
            for callback in self.callbacks:
                callback.on_load_checkpoint(self.me, module, checkpoint)
            strategy.set_state_dict(
                module,
                self.optimizers if stage == "fit" else [],
                checkpoint,
                source=run.ckpt_path,
            )
        if stage == "fit":
            self._fit(
                module, loaders, run.val_loaders, datamodule=datamodule, checkpoint=checkpoint
            )
            return None
        loader = loaders if loaders is not None else _datamodule_loader(datamodule, stage)
        if stage == "predict":
            return self._predict(module, loader)
        return [self._evaluate(stage, module, loader)]

    @staticmethod
    def _check_checkpoint(checkpoint: Checkpoint, path: PathLike | None) -> None:
        missing = [key for key in ("state_dict", "loops") if key not in checkpoint]
        if missing:
            raise CheckpointError(
                str(path),
                f"is not a trainer checkpoint: it lacks {', '.join(missing)}",
                fix="resume from a checkpoint written by ModelCheckpoint or "
                "Trainer.save_checkpoint; load other files into the module yourself",
            )

    # Fit.

    def _fit(
        self,
        module: Module,
        loaders: Iterable[object] | None,
        val_loaders: Iterable[object] | None,
        *,
        datamodule: DataModule | None,
        checkpoint: Checkpoint | None,
    ) -> None:
        strategy = self.strategy
        train = loaders if loaders is not None else _datamodule_loader(datamodule, "fit")
        validate_with = val_loaders
        if validate_with is None and datamodule is not None and datamodule.has("val_dataloader"):
            validate_with = datamodule.val_dataloader()
        if validate_with is not None and not overrides(module, "validation_step"):
            rank_zero_warn("validation data was given, but the module has no validation_step")
            validate_with = None
        # The order of every epoch follows from this seed: a resumed run keeps it.
        self._sampler_seed = (
            int(checkpoint["loops"].get("sampler_seed", 0)) if checkpoint else sampler_seed()
        )
        layout = strategy.layout
        train_loader = prepare_loader(
            train,
            training=True,
            rank=layout.data_parallel_rank,
            world_size=layout.data_parallel_size,
            seed=self._sampler_seed,
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
        resume = Resume() if checkpoint is None else self._restore(checkpoint)
        module.train()
        module.on_fit_start()
        for callback in self.callbacks:
            callback.on_fit_start(self.me, module)
        self._stopping = None
        with GracefulStop(self.stop_signals) as graceful:
            self._graceful = graceful
            try:
                while not self._done():
                    self._train_epoch(module, train_loader, val_loader, resume)
                    resume = Resume()
            finally:
                self._graceful = None
        module.on_fit_end()
        for callback in self.callbacks:
            callback.on_fit_end(self.me, module)

    def _done(self) -> bool:
        if self.should_stop:
            return True
        if self.max_steps != -1 and self.global_step >= self.max_steps:
            return True
        return self.max_epochs is not None and self.current_epoch >= self.max_epochs

    def _agreed_batches(self, loader: Iterable[object]) -> int | None:
        available = length(loader)
        limited = limit_batches(available, self.limits["fit"], "limit_train_batches")
        strategy = self.strategy
        if strategy.world_size == 1 or limited is None:
            return limited
        # Every rank must run as many batches as the others, or one would wait in a
        # gradient all-reduce for a rank that has finished: take the least.
        fewest = int(strategy.reduce(limited, reduce_op="min"))
        if fewest != limited:
            rank_zero_warn(
                f"the ranks hold different numbers of training batches; each runs {fewest}"
            )
        return fewest

    def _train_epoch(
        self,
        module: Module,
        loader: Iterable[object],
        val_loader: Iterable[object] | None,
        resume: Resume,
    ) -> None:
        set_epoch(loader, self.current_epoch)
        total = self._agreed_batches(loader)
        self.num_training_batches = total if total is not None else 0
        metrics = Metrics(stage="fit", training=True)
        if resume.metrics is not None:
            metrics.load_state_dict(resume.metrics)
        self._active_metrics = metrics
        self._epoch_done = False
        self._batches_done = resume.start_batch
        module.on_train_epoch_start()
        for callback in self.callbacks:
            callback.on_train_epoch_start(self.me, module)
        if resume.rng is not None and resume.start_batch == 0:
            set_rng_state(resume.rng)
        batches = self._batches(loader, total)
        for _ in range(resume.start_batch):
            next(batches, None)
        if resume.rng is not None and resume.start_batch > 0:
            set_rng_state(resume.rng)
        val_every = self._validation_every(total)
        validated_at_end = False
        for batch_idx, batch in batches:
            self._train_batch(module, metrics, batch_idx, batch)
            last = total is not None and batch_idx + 1 == total
            due = val_every is not None and ((batch_idx + 1) % val_every == 0 or last)
            if val_loader is not None and self._validation_due() and due:
                self._validate_during_fit(module, val_loader)
                validated_at_end = last
            self._stop_if_asked(batch_idx)
            if self.max_steps != -1 and self.global_step >= self.max_steps:
                break
        at_end = val_every is None and not validated_at_end
        if val_loader is not None and self._validation_due() and at_end:
            self._validate_during_fit(module, val_loader)
        self._end_epoch(module, metrics, complete=total is None)

    def _train_batch(self, module: Module, metrics: Metrics, batch_idx: int, batch: object) -> None:
        # The hottest code of the trainer: properties are read once, into locals.
        strategy = self.strategy
        world_size = self._world_size
        wrapped, steps = self._wrapped, self._steps
        assert wrapped is not None
        assert steps is not None
        me = self.me
        self._current_batch = on_device = to_device(batch, strategy.root_device)
        self._active_metrics = metrics
        metrics.start_step()
        for callback in self.callbacks:
            callback.on_train_batch_start(me, module, on_device, batch_idx)
        module.on_train_batch_start(on_device, batch_idx)
        stepping = self.is_optimizer_step_batch(batch_idx)
        if steps.stage != "fit":  # set only after validation: a Module's setattr is slow
            steps.stage = "fit"
        if stepping:  # the usual batch: no context, and no (slow) Protocol check
            output = self._forward_backward(strategy, wrapped, on_device, batch_idx)
            self._optimizer_step(strategy, wrapped, module)
        else:
            # Between optimizer steps, gradients accumulate without synchronisation.
            with strategy.no_sync(wrapped):
                output = self._forward_backward(strategy, wrapped, on_device, batch_idx)
        self._batches_done = batch_idx + 1
        # Agreed at each epoch's first batch, then at every batch while any rank
        # syncs step values: a metric synced on one rank only fails at once.
        self._step_sync = metrics.sync_step(
            strategy, world_size, required=self._step_sync or batch_idx == 0
        )
        self._publish_step(metrics, stepping=stepping)
        for callback in self.callbacks:
            callback.on_train_batch_end(me, module, output, on_device, batch_idx)
        module.on_train_batch_end(output, on_device, batch_idx)

    def _forward_backward(
        self, strategy: Strategy, wrapped: torch.nn.Module, batch: object, batch_idx: int
    ) -> StepOutput:
        output: StepOutput = strategy.training_step(wrapped, batch, batch_idx)  # type: ignore[assignment]
        loss = _loss(output, self._world_size)
        if loss is not None:
            if self.accumulate_grad_batches > 1:
                loss = loss / self.accumulate_grad_batches
            strategy.backward(loss, wrapped)
        return output

    def _end_epoch(self, module: Module, metrics: Metrics, *, complete: bool) -> None:
        self._active_metrics = metrics
        metrics.epoch_end = True
        module.on_train_epoch_end()
        self._publish_epoch(metrics, training=True)
        self._active_metrics = None
        self._step_schedulers("epoch")
        self._epoch_done = complete or self._batches_done >= self.num_training_batches
        for callback in self.callbacks:
            callback.on_train_epoch_end(self.me, module)
        # Any rank may have asked to stop: all stop together, or none does.
        self.should_stop = self.strategy.reduce_boolean_decision(self.should_stop, all=False)
        self.current_epoch += 1

    def _device_loader(self, loader: Iterable[object]) -> Iterable[object]:
        # The strategy's wrapper (XLA's device loader), around the loader the Trainer
        # prepared; the loader itself keeps receiving set_epoch and being measured.
        strategy = self.strategy
        if isinstance(strategy, SupportsProcessDataloader):
            return strategy.process_dataloader(loader)
        return loader

    def _batches(self, loader: Iterable[object], total: int | None) -> Iterator[tuple[int, object]]:
        strategy = self.strategy
        iterator = iter(self._device_loader(loader))
        index = 0
        while total is None or index < total:
            try:
                batch = next(iterator)
                more = True
            except StopIteration:
                batch, more = None, False
            if total is None and strategy.world_size > 1:
                # A loader without a length: the ranks agree, batch by batch, to go on
                # only while every one of them has a batch.
                more = strategy.reduce_boolean_decision(more, all=True)
            if not more:
                return
            yield index, batch
            index += 1

    def _stop_if_asked(self, batch_idx: int) -> None:
        # Every rank, after every training batch: the ranks agree (every few batches)
        # whether a stop signal came to any of them, then stop together at the first
        # batch that ends with an optimizer step (accumulated gradients are not saved).
        graceful = self._graceful
        if graceful is None:
            return
        strategy = self.strategy
        agreed = graceful.after_batch(strategy, strategy.world_size)
        if agreed is not None and self._stopping is None:
            self._stopping = agreed
        if self._stopping is None or not self.is_optimizer_step_batch(batch_idx):
            return
        callback = self.me.checkpoint_callback
        path = callback.last_path() if callback is not None else None
        if callback is not None and path is not None:
            callback.last_model_path = path
            self.write_checkpoint(path)
        stopped = TrainingStopped(self._stopping, path, self.global_step)
        if self.is_global_zero:
            sys.stderr.write(f"plait: {stopped.describe()}\n")
            sys.stderr.flush()
        raise stopped

    def _validation_every(self, total: int | None) -> int | None:
        interval = self.val_check_interval
        if isinstance(interval, int):
            return interval
        if interval == 1.0 or total is None:
            return None
        return max(1, math.floor(total * interval))

    def _validation_due(self) -> bool:
        return (self.current_epoch + 1) % self.check_val_every_n_epoch == 0

    def is_optimizer_step_batch(self, batch_idx: int) -> bool:
        """Whether the batch ``batch_idx`` of this epoch ends with an optimizer step."""
        every = self.accumulate_grad_batches
        return (batch_idx + 1) % every == 0 or batch_idx + 1 == self.num_training_batches

    def _optimizer_step(self, strategy: Strategy, wrapped: torch.nn.Module, module: Module) -> None:
        for optimizer in self.optimizers:
            if self.gradient_clip_val is not None:
                strategy.clip_gradients(
                    wrapped, optimizer, self.gradient_clip_val, self.gradient_clip_algorithm
                )
            for callback in self.callbacks:
                callback.on_before_optimizer_step(self.me, module, optimizer)
            strategy.optimizer_step(optimizer)
            strategy.zero_grad(optimizer)
        self.global_step += 1
        self._step_schedulers("step")

    def _step_schedulers(self, interval: str) -> None:
        count = self.global_step if interval == "step" else self.current_epoch + 1
        for config in self.lr_schedulers:
            if config.interval != interval or count % config.frequency != 0:
                continue
            if isinstance(config.scheduler, ReduceLROnPlateau):
                assert config.monitor is not None  # checked when configured
                if config.monitor not in self.callback_metrics:
                    raise ConfigurationError(
                        f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; "
                        f"logged: {', '.join(sorted(self.callback_metrics)) or 'nothing'}",
                        value=config.monitor,
                        fix="log it with self.log, or monitor a logged metric",
                    )
                config.scheduler.step(float(self.callback_metrics[config.monitor]))
            else:
                config.scheduler.step()

    def _publish_step(self, metrics: Metrics, *, stepping: bool) -> None:
        values = metrics.step_values
        if not values:
            return
        to_log: dict[str, Number] = {}
        for name, value in values.items():
            options = metrics.options[name]
            key = f"{name}_step" if options.on_epoch else name
            self.callback_metrics[key] = value
            if options.prog_bar:
                self.progress_bar_metrics[name] = value
            if options.logger:
                to_log[key] = value
        if stepping and self.global_step % self.log_every_n_steps == 0:
            self.log_to_loggers(to_log)

    def _publish_epoch(self, metrics: Metrics, *, training: bool) -> dict[str, Number]:
        strategy = self.strategy
        values = metrics.fold(strategy, strategy.world_size)
        options = metrics.epoch_options()
        to_log: dict[str, Number] = {}
        for name, value in values.items():
            both = training and options[name].on_step
            self.callback_metrics[name] = value
            if both:
                self.callback_metrics[f"{name}_epoch"] = value
            if options[name].prog_bar:
                self.progress_bar_metrics[name] = value
            if options[name].logger:
                to_log[f"{name}_epoch" if both else name] = value
        self.log_to_loggers(to_log)
        return values

    # Evaluation.

    def _validate_during_fit(self, module: Module, loader: Iterable[object]) -> None:
        # Validation must not shift training's random stream (nor its metrics).
        training_metrics = self._active_metrics
        with preserved_rng():
            self._evaluate("validate", module, loader)
        self._active_metrics = training_metrics
        module.train()

    def _evaluate(
        self, stage: Stage, module: Module, loader: Iterable[object]
    ) -> dict[str, Number]:
        strategy = self.strategy
        steps, wrapped = self._steps, self._wrapped
        assert steps is not None
        assert wrapped is not None
        prepared = self._evaluation_loader(loader)
        limit_name = "limit_val_batches" if stage == "validate" else "limit_test_batches"
        total = limit_batches(length(prepared), self.limits[stage], limit_name)
        self.num_eval_batches = total if total is not None else 0
        metrics = Metrics(stage=stage, training=False)
        self._active_metrics = metrics
        validating = stage == "validate"
        module.eval()
        for callback in self.callbacks:
            hook = callback.on_validation_start if validating else callback.on_test_start
            hook(self.me, module)
        (module.on_validation_epoch_start if validating else module.on_test_epoch_start)()
        # Through the wrapper, whose forward may be collective (FSDP's is): every
        # rank runs as many forwards, the ranks with fewer batches padding.
        steps.stage = stage
        step = strategy.validation_step if validating else strategy.test_step
        for batch_idx, batch, real in self._even_batches(prepared, total):
            on_device = to_device(batch, strategy.root_device)
            if not real:
                self._pad(step, wrapped, on_device, batch_idx)
                continue
            self._current_batch = on_device
            output = step(wrapped, on_device, batch_idx)
            for callback in self.callbacks:
                if validating:
                    callback.on_validation_batch_end(self.me, module, output, on_device, batch_idx)
                else:
                    callback.on_test_batch_end(self.me, module, output, on_device, batch_idx)
        (module.on_validation_epoch_end if validating else module.on_test_epoch_end)()
        values = self._publish_epoch(metrics, training=False)
        for callback in self.callbacks:
            hook = callback.on_validation_end if validating else callback.on_test_end
            hook(self.me, module)
        self._active_metrics = None
        steps.stage = "fit"
        return values

    def _predict(self, module: Module, loader: Iterable[object]) -> list[object]:
        strategy = self.strategy
        steps, wrapped = self._steps, self._wrapped
        assert steps is not None
        assert wrapped is not None
        prepared = self._evaluation_loader(loader)
        total = limit_batches(length(prepared), self.limits["predict"], "limit_predict_batches")
        self.num_eval_batches = total if total is not None else 0
        module.eval()
        for callback in self.callbacks:
            callback.on_predict_start(self.me, module)
        steps.stage = "predict"
        outputs: list[object] = []
        for batch_idx, batch, real in self._even_batches(prepared, total):
            on_device = to_device(batch, strategy.root_device)
            if not real:
                self._pad(strategy.predict_step, wrapped, on_device, batch_idx)
                continue
            self._current_batch = on_device
            output = strategy.predict_step(wrapped, on_device, batch_idx)
            outputs.append(to_device(output, torch.device("cpu")))
            for callback in self.callbacks:
                callback.on_predict_batch_end(self.me, module, output, on_device, batch_idx)
        for callback in self.callbacks:
            callback.on_predict_end(self.me, module)
        if strategy.world_size == 1:
            return outputs
        # Each data-parallel rank predicted a contiguous block: in rank order, they
        # are the loader's order (ranks that read the same data predicted alike).
        mine = (strategy.layout.data_parallel_rank, outputs)
        blocks: dict[int, list[object]] = {}
        for shard, share in gather_objects(strategy, mine):
            blocks.setdefault(shard, share)
        return [output for shard in sorted(blocks) for output in blocks[shard]]

    def _evaluation_loader(self, loader: Iterable[object]) -> Iterable[object]:
        layout = self.strategy.layout
        return prepare_loader(
            loader,
            training=False,
            rank=layout.data_parallel_rank,
            world_size=layout.data_parallel_size,
        )

    def _pad(
        self, step: Callable[..., object], wrapped: torch.nn.Module, batch: object, batch_idx: int
    ) -> None:
        # A forward that keeps this rank in step with ranks holding more batches: its
        # output, its logged values and its hooks are dropped, so that every sample
        # counts once.
        counted = self._active_metrics
        self._active_metrics = Metrics(stage="validate", training=False)
        try:
            step(wrapped, batch, batch_idx)
        finally:
            self._active_metrics = counted

    def _even_batches(
        self, loader: Iterable[object], total: int | None
    ) -> Iterator[tuple[int, object, bool]]:
        """``(index, batch, real)`` until no rank has a batch left.

        A rank whose own batches ran out gets its last batch again with ``real``
        false (or, having had none, the first batch of the first rank that has one).
        """
        strategy = self.strategy
        world = strategy.world_size
        device = strategy.root_device
        counts = None
        if world > 1 and total is not None:
            counts = strategy.all_gather(torch.tensor([total], device=device)).flatten().tolist()
        iterator = iter(self._device_loader(loader))
        last: object = None
        had_one = False
        index = 0
        while True:
            batch, more = None, False
            if total is None or index < total:
                with contextlib.suppress(StopIteration):
                    batch, more = next(iterator), True
            if world == 1:
                if not more:
                    return
                yield index, batch, True
                index += 1
                continue
            if counts is not None:
                holding = [count > index for count in counts]
            else:
                # Without lengths, the ranks say at each batch which of them has one.
                flag = torch.tensor([more], device=device)
                holding = [bool(f) for f in strategy.all_gather(flag).flatten().tolist()]
            if not any(holding):
                return
            if index == 0 and not all(holding):
                # A rank without any batch pads with another rank's first.
                giver = holding.index(True)
                last = strategy.broadcast(
                    batch if strategy.global_rank == giver else None, src=giver
                )
                had_one = True
            if more:
                last, had_one = batch, True
                yield index, batch, True
            else:
                assert had_one
                yield index, last, False
            index += 1

    # Checkpoints.

    def write_checkpoint(self, path: PathLike) -> None:
        """Build the checkpoint of the run as it stands and save it (every rank calls it)."""
        strategy = self.strategy
        steps, wrapped = self._steps, self._wrapped
        assert steps is not None, "no run is in progress"
        assert wrapped is not None
        module = steps.module
        states = gather_objects(strategy, rng_state())
        metrics = self._active_metrics
        checkpoint: Checkpoint = {
            "plait": {"format": CHECKPOINT_FORMAT},
            "epoch": self.current_epoch,
            "global_step": self.global_step,
            "loops": {
                "epoch": self.current_epoch,
                "batches_done": self._batches_done,
                "epoch_done": self._epoch_done,
                "sampler_seed": self._sampler_seed,
                "train_metrics": (
                    metrics.state_dict() if metrics is not None and metrics.training else None
                ),
            },
            # The strategy's share: module, optimizers and precision (sharded or full).
            **strategy.get_state_dict(module, self.optimizers),
            "lr_schedulers": [config.scheduler.state_dict() for config in self.lr_schedulers],
            "callbacks": {c.state_key: c.state_dict() for c in self.callbacks},
            "rng_states": states,
        }
        module.on_save_checkpoint(checkpoint)
        for callback in self.callbacks:
            callback.on_save_checkpoint(self.me, module, checkpoint)
        strategy.save_checkpoint(checkpoint, path)
        # A save of a large model may take longer than any collective should: the
        # wait for it has a bound of its own.
        strategy.barrier("save_checkpoint", timeout=self.checkpoint_timeout)

    def _restore(self, checkpoint: Checkpoint) -> Resume:
        strategy = self.strategy
        for config, state in zip(
            self.lr_schedulers, checkpoint.get("lr_schedulers", []), strict=False
        ):
            config.scheduler.load_state_dict(state)
        for callback in self.callbacks:
            state = checkpoint.get("callbacks", {}).get(callback.state_key)
            if state is not None:
                callback.load_state_dict(state)
        loops = checkpoint["loops"]
        self.global_step = int(checkpoint["global_step"])
        self.current_epoch = int(loops["epoch"])
        start = int(loops["batches_done"])
        metrics_state = loops.get("train_metrics")
        if loops["epoch_done"]:
            self.current_epoch += 1
            start, metrics_state = 0, None
        states = checkpoint.get("rng_states") or []
        mine: dict[str, object] | None = None
        if len(states) == strategy.world_size:
            mine = states[strategy.global_rank]
        elif states:
            rank_zero_warn(
                f"the checkpoint holds the random states of {len(states)} ranks, and this run "
                f"has {strategy.world_size}: they are not restored"
            )
        return Resume(start_batch=start, rng=mine, metrics=metrics_state)


def _datamodule_loader(datamodule: DataModule | None, stage: Stage) -> Iterable[object]:
    assert datamodule is not None  # checked before the run
    method = {
        "fit": datamodule.train_dataloader,
        "validate": datamodule.val_dataloader,
        "test": datamodule.test_dataloader,
        "predict": datamodule.predict_dataloader,
    }[stage]
    return method()
