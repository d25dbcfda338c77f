"""The one place the loops call callbacks, module and strategy hooks from: a method per event."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from plait.core import SupportsLifecycleHooks
from plait.trainer.callbacks.base import Callback
from plait.trainer.module import Module
from plait.trainer.profiler import PassThroughProfiler, Profiler

if TYPE_CHECKING:
    import torch

    from plait.core.typing import Checkpoint
    from plait.trainer.limits import Stage
    from plait.trainer.trainer import Trainer
    from plait.trainer.values import StepOutput

__all__ = ["Hooks"]

P = ParamSpec("P")
R = TypeVar("R")

_EVENTS: list[str] = []  # the events, each timed by `_profiled`


def _profiled(method: Callable[Concatenate[Hooks, P], R]) -> Callable[Concatenate[Hooks, P], R]:
    """The event, run inside the profiler's region ``[Hooks]<event>``."""
    name = f"[Hooks]{method.__name__}"
    _EVENTS.append(method.__name__)

    @functools.wraps(method)
    def profiled(hooks: Hooks, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with hooks.profiler.region(name):
            return method(hooks, *args, **kwargs)

    return profiled


def _does(owner: Callback | Module, hook: str) -> bool:
    """Whether ``owner``'s ``hook`` is its own: not the empty one of `Callback` or `Module`."""
    base: type = Module if isinstance(owner, Module) else Callback
    method = getattr(owner, hook)
    # A hook set on the instance (no __func__) is the owner's own too.
    return getattr(method, "__func__", None) is not getattr(base, hook, None)


def _doing(callbacks: list[Callback], hook: str) -> list[Callback]:
    """The callbacks whose ``hook`` is their own (`_does`), in their order."""
    return [callback for callback in callbacks if _does(callback, hook)]


class Hooks:
    """Calls an event's hooks, on every callback and on the module, in a fixed order.

    Where the module and the callbacks share an event, the module's hook runs first
    at a start and the callbacks' first at a batch's start and end (as Lightning
    orders them). The loops hold one `Hooks` per run and call nothing else.

    Every event runs in a region of the profiler, named ``[Hooks]<event>``. The
    events of every batch call the hooks the callbacks and the module define when the
    run starts (a hook set on an instance counts); the base classes' empty hooks are
    not called, and where no hook of an event is defined (nor a profiler times it)
    the loops skip the event's call too (`runs_batch_start`, `runs_batch_end`,
    `runs_before_backward`, `runs_after_backward`, `runs_before_optimizer_step`).

    Args:
        trainer: What the callbacks receive.
        module: The user's module.
        callbacks: The trainer's callbacks, in their order.
        profiler: Times the events (and, through this object, the loops' regions).
    """

    def __init__(
        self,
        trainer: Trainer,
        module: Module,
        callbacks: list[Callback],
        profiler: Profiler | None = None,
    ) -> None:
        self.trainer = trainer
        self.module = module
        strategy = trainer.strategy
        self.strategy = strategy if isinstance(strategy, SupportsLifecycleHooks) else None
        """The strategy, told where the run is (checked once: one without hooks is skipped)."""
        self.callbacks = callbacks
        self.profiler: Profiler = profiler if profiler is not None else PassThroughProfiler()
        if isinstance(self.profiler, PassThroughProfiler):
            # Nothing to time: each event is the method itself, without the wrapper,
            # on the hot path.
            for event in _EVENTS:
                setattr(self, event, getattr(type(self), event).__wrapped__.__get__(self))
        # The events of every batch call only the hooks that do something: a base
        # class's empty hook is left out (the list is read once per run).
        self._batch_start = _doing(callbacks, "on_train_batch_start")
        self._batch_end = _doing(callbacks, "on_train_batch_end")
        self._before_optimizer_step = _doing(callbacks, "on_before_optimizer_step")
        self._before_backward = _doing(callbacks, "on_before_backward")
        self._after_backward = _doing(callbacks, "on_after_backward")
        self._module_batch_start = _does(module, "on_train_batch_start")
        self._module_batch_end = _does(module, "on_train_batch_end")
        self._module_before_optimizer_step = _does(module, "on_before_optimizer_step")
        self._module_before_backward = _does(module, "on_before_backward")
        self._module_after_backward = _does(module, "on_after_backward")
        # Whether each per-batch event calls anything (or is timed): where not, the
        # loops skip the event's call too, and a hook nobody defines costs nothing.
        timed = not isinstance(self.profiler, PassThroughProfiler)
        self.runs_batch_start = timed or bool(self._batch_start) or self._module_batch_start
        self.runs_batch_end = timed or bool(self._batch_end) or self._module_batch_end
        self.runs_before_backward = (
            timed or bool(self._before_backward) or self._module_before_backward
        )
        self.runs_after_backward = (
            timed or bool(self._after_backward) or self._module_after_backward
        )
        self.runs_before_optimizer_step = (
            timed or bool(self._before_optimizer_step) or self._module_before_optimizer_step
        )

    # A run.

    @_profiled
    def setup(self, stage: Stage) -> None:
        """A run starts (before the module is set up)."""
        for callback in self.callbacks:
            callback.setup(self.trainer, self.module, stage)

    @_profiled
    def teardown(self, stage: Stage) -> None:
        """A run ends, however it ends."""
        for callback in self.callbacks:
            callback.teardown(self.trainer, self.module, stage)

    @_profiled
    def on_exception(self, error: BaseException) -> None:
        """A run fails."""
        for callback in self.callbacks:
            callback.on_exception(self.trainer, self.module, error)

    @_profiled
    def on_save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """A checkpoint is built: the module and callbacks may add to it."""
        self.module.on_save_checkpoint(checkpoint)
        for callback in self.callbacks:
            callback.on_save_checkpoint(self.trainer, self.module, checkpoint)

    @_profiled
    def on_load_checkpoint(self, checkpoint: Checkpoint) -> None:
        """A checkpoint was read, before its state is loaded."""
        self.module.on_load_checkpoint(checkpoint)
        for callback in self.callbacks:
            callback.on_load_checkpoint(self.trainer, self.module, checkpoint)

    # Fit.

    @_profiled
    def on_fit_start(self) -> None:
        """Training starts."""
        if self.strategy is not None:
            self.strategy.on_fit_start(self.trainer)
        self.module.on_fit_start()
        for callback in self.callbacks:
            callback.on_fit_start(self.trainer, self.module)

    @_profiled
    def on_fit_end(self) -> None:
        """Training ended."""
        self.module.on_fit_end()
        for callback in self.callbacks:
            callback.on_fit_end(self.trainer, self.module)
        if self.strategy is not None:
            self.strategy.on_fit_end()

    @_profiled
    def on_train_start(self) -> None:
        """The training loop starts (after the sanity check)."""
        if self.strategy is not None:
            self.strategy.on_train_start()
        self.module.on_train_start()
        for callback in self.callbacks:
            callback.on_train_start(self.trainer, self.module)

    @_profiled
    def on_train_end(self) -> None:
        """The training loop reached its end (not when it failed or was stopped)."""
        self.module.on_train_end()
        for callback in self.callbacks:
            callback.on_train_end(self.trainer, self.module)
        if self.strategy is not None:
            self.strategy.on_train_end()

    @_profiled
    def on_train_epoch_start(self) -> None:
        """A training epoch starts."""
        self.module.on_train_epoch_start()
        for callback in self.callbacks:
            callback.on_train_epoch_start(self.trainer, self.module)

    @_profiled
    def on_train_epoch_end_module(self) -> None:
        """A training epoch ended: the module's hook, before its values are published."""
        self.module.on_train_epoch_end()

    @_profiled
    def on_train_epoch_end(self) -> None:
        """A training epoch ended: the callbacks, once its values are published."""
        for callback in self.callbacks:
            callback.on_train_epoch_end(self.trainer, self.module)

    @_profiled
    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        """A training batch starts (on the device)."""
        trainer, module = self.trainer, self.module
        for callback in self._batch_start:
            callback.on_train_batch_start(trainer, module, batch, batch_idx)
        if self._module_batch_start:
            module.on_train_batch_start(batch, batch_idx)

    @_profiled
    def on_train_batch_end(self, output: StepOutput, batch: object, batch_idx: int) -> None:
        """A training batch ended."""
        trainer, module = self.trainer, self.module
        for callback in self._batch_end:
            callback.on_train_batch_end(trainer, module, output, batch, batch_idx)
        if self._module_batch_end:
            module.on_train_batch_end(output, batch, batch_idx)

    @_profiled
    def on_before_backward(self, loss: torch.Tensor) -> None:
        """A backward pass of ``loss`` is about to run."""
        trainer, module = self.trainer, self.module
        for callback in self._before_backward:
            callback.on_before_backward(trainer, module, loss)
        if self._module_before_backward:
            module.on_before_backward(loss)

    @_profiled
    def on_after_backward(self) -> None:
        """A backward pass ran (gradients not yet clipped)."""
        trainer, module = self.trainer, self.module
        for callback in self._after_backward:
            callback.on_after_backward(trainer, module)
        if self._module_after_backward:
            module.on_after_backward()

    @_profiled
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer is about to step (gradients are final and clipped)."""
        trainer, module = self.trainer, self.module
        for callback in self._before_optimizer_step:
            callback.on_before_optimizer_step(trainer, module, optimizer)
        if self._module_before_optimizer_step:
            module.on_before_optimizer_step(optimizer)

    # Evaluation and prediction.

    @_profiled
    def on_evaluation_start(self, stage: Stage) -> None:
        """A validation or test loop starts."""
        validating = stage == "validate"
        strategy = self.strategy
        if strategy is not None:
            (strategy.on_validation_start if validating else strategy.on_test_start)()
        module = self.module
        (module.on_validation_start if validating else module.on_test_start)()
        for callback in self.callbacks:
            hook = callback.on_validation_start if validating else callback.on_test_start
            hook(self.trainer, self.module)
        (module.on_validation_epoch_start if validating else module.on_test_epoch_start)()

    def on_evaluation_batch_end(
        self, stage: Stage, output: object, batch: object, batch_idx: int
    ) -> None:
        """A validation or test batch ended."""
        trainer, module = self.trainer, self.module
        for callback in self.callbacks:
            if stage == "validate":
                callback.on_validation_batch_end(trainer, module, output, batch, batch_idx)
            else:
                callback.on_test_batch_end(trainer, module, output, batch, batch_idx)

    @_profiled
    def on_evaluation_epoch_end(self, stage: Stage) -> None:
        """A validation or test loop ran its batches: the module's hook, before publishing."""
        module = self.module
        (module.on_validation_epoch_end if stage == "validate" else module.on_test_epoch_end)()

    @_profiled
    def on_evaluation_end(self, stage: Stage) -> None:
        """A validation or test loop ended: the module and callbacks, its values published."""
        module = self.module
        (module.on_validation_end if stage == "validate" else module.on_test_end)()
        for callback in self.callbacks:
            hook = callback.on_validation_end if stage == "validate" else callback.on_test_end
            hook(self.trainer, self.module)
        strategy = self.strategy
        if strategy is not None:
            (strategy.on_validation_end if stage == "validate" else strategy.on_test_end)()

    @_profiled
    def on_predict_start(self) -> None:
        """Prediction starts."""
        if self.strategy is not None:
            self.strategy.on_predict_start()
        self.module.on_predict_start()
        for callback in self.callbacks:
            callback.on_predict_start(self.trainer, self.module)

    @_profiled
    def on_predict_batch_end(self, output: object, batch: object, batch_idx: int) -> None:
        """A prediction batch ended."""
        for callback in self.callbacks:
            callback.on_predict_batch_end(self.trainer, self.module, output, batch, batch_idx)

    @_profiled
    def on_predict_end(self) -> None:
        """Prediction ended."""
        self.module.on_predict_end()
        for callback in self.callbacks:
            callback.on_predict_end(self.trainer, self.module)
        if self.strategy is not None:
            self.strategy.on_predict_end()
