"""How a training batch becomes an optimizer step: forward, backward, clip, step, schedule."""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau
from typing_extensions import override

from plait.core import (
    ConfigurationError,
    GradientClipAlgorithm,
    Strategy,
    SupportsAccumulation,
    SupportsClosureOptimizers,
    SupportsManualOptimization,
)
from plait.trainer.profiler import regions_of

if TYPE_CHECKING:
    from plait.trainer.hooks import Hooks
    from plait.trainer.module import Module
    from plait.trainer.optim import SchedulerConfig
    from plait.trainer.progress import Progress
    from plait.trainer.results import Results
    from plait.trainer.run_state import Attached
    from plait.trainer.values import StepOutput

__all__ = [
    "AutomaticOptimization",
    "ManualOptimization",
    "Optimization",
    "Schedulers",
    "TrainerOptimizer",
    "check_closure_optimizers",
    "is_step_batch",
    "needs_closure",
    "training_loss",
]


def is_step_batch(batch_idx: int, accumulate: int, total: int) -> bool:
    """Whether batch ``batch_idx`` of an epoch of ``total`` (0: unknown) ends with a step."""
    return (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == total


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer``'s ``step`` must be given a closure (LBFGS's does)."""
    try:
        closure = inspect.signature(type(optimizer).step).parameters.get("closure")
    except (TypeError, ValueError):  # a step without a signature to read
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def check_closure_optimizers(
    strategy: Strategy,
    optimizers: Sequence[torch.optim.Optimizer],
    *,
    automatic: bool,
    accumulate: int,
) -> None:
    """Refuse, before set-up, an optimizer that steps with a closure where it cannot work.

    Raises:
        ConfigurationError: The strategy cannot run closures (it shards the
            parameters, or scales the loss), or, in automatic optimization, the
            closure optimizer is one of several, or batches are accumulated.
    """
    for optimizer in optimizers:
        if not needs_closure(optimizer):
            continue
        name = type(optimizer).__name__
        if isinstance(strategy, SupportsClosureOptimizers):
            strategy.check_closure_optimizer(optimizer)
        elif strategy.world_size > 1:
            raise ConfigurationError(
                f"{name} steps with a closure, and {type(strategy).__name__} does not say "
                "whether it can run one on several processes (check_closure_optimizer)",
                value=name,
                fix="subclass plait.strategies.Strategy (BaseStrategy), or implement "
                "check_closure_optimizer",
            )
        if automatic and len(optimizers) > 1:
            raise ConfigurationError(
                f"{name} steps with a closure that runs the whole training step, and "
                f"configure_optimizers returned {len(optimizers)} optimizers, which would "
                "all take the step's gradients",
                value=[type(o).__name__ for o in optimizers],
                fix=f"return {name} alone, or step the optimizers yourself "
                "(self.automatic_optimization = False)",
            )
        if automatic and accumulate > 1:
            raise ConfigurationError(
                f"{name} steps with a closure that evaluates one batch again and again, "
                f"and accumulate_grad_batches={accumulate} would spread a step over several",
                value=accumulate,
                fix="drop accumulate_grad_batches, or use larger batches",
            )


def training_loss(output: StepOutput, world_size: int) -> torch.Tensor | None:
    """The loss in what ``training_step`` returned; ``None`` skips the batch (one process only).

    Raises:
        ConfigurationError: The output holds no loss tensor, or is ``None`` on one
            rank of several.
    """
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


_STEP_ORDER_WARNING = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"


class Schedulers:
    """Steps the learning-rate schedulers at their interval and frequency.

    Args:
        configs: The schedulers, as `configure_optimizers` configured them.
        progress: The counters (a step's count is the global step; an epoch's, the
            epochs finished).
        results: The logged values a ``ReduceLROnPlateau`` monitors.
    """

    def __init__(
        self, configs: list[SchedulerConfig], progress: Progress, results: Results
    ) -> None:
        self.configs = configs
        self.progress = progress
        self.results = results
        self._unstepped = list(configs)

    def step(self, interval: str) -> None:
        """Step the schedulers of ``interval`` (``"step"`` or ``"epoch"``) that are due.

        Raises:
            ConfigurationError: A ``ReduceLROnPlateau`` monitors a value never logged.
        """
        progress = self.progress
        count = progress.global_step if interval == "step" else progress.current_epoch + 1
        for config in self.configs:
            if config.interval != interval or count % config.frequency != 0:
                continue
            if progress.global_step > 0 and config in self._unstepped:
                # A resumed run may end an epoch whose steps its checkpoint holds
                # before this process steps an optimizer: torch's warning that the
                # scheduler steps first is about this process, not the run.
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", _STEP_ORDER_WARNING, UserWarning)
                    self._step(config)
            else:
                self._step(config)
            if config in self._unstepped:
                self._unstepped.remove(config)

    def _step(self, config: SchedulerConfig) -> None:
        if isinstance(config.scheduler, ReduceLROnPlateau):
            assert config.monitor is not None  # checked when configured
            logged = self.results.callback_metrics
            if config.monitor not in logged:
                raise ConfigurationError(
                    f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; "
                    f"logged: {', '.join(sorted(logged)) or 'nothing'}",
                    value=config.monitor,
                    fix="log it with self.log, or monitor a logged metric",
                )
            config.scheduler.step(float(logged[config.monitor]))
        else:
            config.scheduler.step()


class Optimization(Protocol):
    """Runs one training batch: its step, and the optimizer steps it ends with."""

    def run(self, batch: object, batch_idx: int, *, stepping: bool) -> StepOutput:
        """Run ``training_step`` on ``batch``; step the optimizers when ``stepping``."""
        ...


class AutomaticOptimization(Optimization):
    """The trainer steps the optimizers: the user's ``training_step`` returns a loss.

    Between optimizer steps gradients accumulate (the loss scaled by the batches
    accumulated, without synchronisation where the strategy can skip it); at a step
    each optimizer is clipped, announced to the callbacks, stepped and zeroed, in
    order, and the step's schedulers follow.

    Args:
        strategy: Runs the step, the backward pass and the optimizer steps.
        attached: The run's wrapper and optimizers.
        hooks: Where ``on_before_optimizer_step`` goes.
        progress: Counts the optimizer steps.
        schedulers: Stepped after each optimizer step.
        accumulate: Batches per optimizer step.
        clip_val: Clip gradients to this norm or value (``None``: no clipping).
        clip_algorithm: ``"norm"`` or ``"value"``.
    """

    def __init__(
        self,
        strategy: Strategy,
        attached: Attached,
        hooks: Hooks,
        progress: Progress,
        schedulers: Schedulers,
        *,
        accumulate: int,
        clip_val: float | None,
        clip_algorithm: GradientClipAlgorithm,
    ) -> None:
        self.strategy = strategy
        self.wrapped = attached.wrapped
        self.optimizers = attached.optimizers
        self.hooks = hooks
        self.progress = progress
        self.schedulers = schedulers
        self.accumulate = accumulate
        self.clip_val = clip_val
        self.clip_algorithm: GradientClipAlgorithm = clip_algorithm
        self.world_size = strategy.world_size
        self.region = hooks.profiler.region
        self.timing = regions_of(hooks.profiler) is not None  # else no region per batch
        # An optimizer that evaluates the step itself (LBFGS), alone (checked at set-up).
        self._closure = len(self.optimizers) == 1 and needs_closure(self.optimizers[0])
        # A strategy whose modules back-propagate inside their call (a pipeline)
        # divides those gradients by the batches accumulated itself.
        if isinstance(strategy, SupportsAccumulation):
            strategy.accumulate(attached.module, accumulate)

    @override
    def run(self, batch: object, batch_idx: int, *, stepping: bool) -> StepOutput:
        if self._closure:
            return self._step_with_closure(batch, batch_idx)
        if stepping:  # the usual batch: no context, and no (slow) Protocol check
            output = self._forward_backward(batch, batch_idx)
            self._optimizer_step()
            return output
        # Between optimizer steps, gradients accumulate without synchronisation.
        with self.strategy.no_sync(self.wrapped):
            return self._forward_backward(batch, batch_idx)

    def _forward_backward(self, batch: object, batch_idx: int) -> StepOutput:
        strategy, wrapped, timing = self.strategy, self.wrapped, self.timing
        output: StepOutput
        if timing:
            with self.region("training_step"):
                output = strategy.training_step(wrapped, batch, batch_idx)  # type: ignore[assignment]
        else:
            output = strategy.training_step(wrapped, batch, batch_idx)  # type: ignore[assignment]
        loss = training_loss(output, self.world_size)
        if loss is not None:
            if self.accumulate > 1:
                loss = loss / self.accumulate
            hooks = self.hooks
            if hooks.runs_before_backward:
                hooks.on_before_backward(loss)
            if timing:
                with self.region("backward"):
                    strategy.backward(loss, wrapped)
            else:
                strategy.backward(loss, wrapped)
            if hooks.runs_after_backward:
                hooks.on_after_backward()
        return output

    def _step_with_closure(self, batch: object, batch_idx: int) -> StepOutput:
        # The optimizer calls the closure as often as it likes: each call zeroes the
        # gradients, runs the step and its backward pass, clips, and tells the
        # callbacks; it returns the loss averaged over the ranks, so that every rank
        # decides alike (their gradients are averaged by the backward pass already).
        strategy, wrapped, optimizer = self.strategy, self.wrapped, self.optimizers[0]
        outputs: list[StepOutput] = []

        def closure() -> torch.Tensor:
            strategy.zero_grad(optimizer)
            output: StepOutput = strategy.training_step(wrapped, batch, batch_idx)  # type: ignore[assignment]
            loss = training_loss(output, self.world_size)
            if loss is None:
                raise ConfigurationError(
                    f"training_step returned None (skip this batch), and "
                    f"{type(optimizer).__name__} steps with a closure that needs the loss",
                    fix="return the loss on every batch",
                )
            self.hooks.on_before_backward(loss)
            strategy.backward(loss, wrapped)
            self.hooks.on_after_backward()
            if self.clip_val is not None:
                strategy.clip_gradients(wrapped, optimizer, self.clip_val, self.clip_algorithm)
            self.hooks.on_before_optimizer_step(optimizer)
            outputs.append(output)
            value = loss.detach()
            if self.world_size > 1:
                value = torch.as_tensor(strategy.reduce(value, reduce_op="mean"))
            return value

        with self.region("optimizer_step"):
            strategy.optimizer_step(optimizer, closure)
        strategy.zero_grad(optimizer)
        self.progress.global_step += 1
        self.schedulers.step("step")
        return outputs[0]  # the step at the parameters the batch started from

    def _optimizer_step(self) -> None:
        strategy, wrapped = self.strategy, self.wrapped
        for optimizer in self.optimizers:
            if self.clip_val is not None:
                strategy.clip_gradients(wrapped, optimizer, self.clip_val, self.clip_algorithm)
            if self.hooks.runs_before_optimizer_step:
                self.hooks.on_before_optimizer_step(optimizer)
            if self.timing:
                with self.region("optimizer_step"):
                    strategy.optimizer_step(optimizer)
            else:
                strategy.optimizer_step(optimizer)
            strategy.zero_grad(optimizer)
        self.progress.global_step += 1
        if self.schedulers.configs:  # none, the usual case: no call
            self.schedulers.step("step")


class TrainerOptimizer:
    """An optimizer as `Module.optimizers` returns it: stepped through the strategy.

    `step` goes through the strategy and its precision (the gradient scaler steps
    and updates; DeepSpeed's engine steps), tells the callbacks first
    (``on_before_optimizer_step``) and counts a global step.

    Args:
        optimizer: The optimizer as the strategy set it up.
        strategy: Steps and zeroes it.
        wrapped: The strategy's wrapper (for `toggle_model`'s ``no_sync``).
        module: The user's module (for `toggle_model`'s toggling).
        hooks: Where ``on_before_optimizer_step`` goes.
        progress: Counts the steps.
        parameter_names: The module's names of the parameters it holds.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        parameter_names: frozenset[str],
        strategy: Strategy,
        wrapped: torch.nn.Module,
        module: Module,
        hooks: Hooks,
        progress: Progress,
    ) -> None:
        self.optimizer = optimizer
        self.parameter_names = parameter_names
        self._strategy = strategy
        self._wrapped = wrapped
        self._module = module
        self._hooks = hooks
        self._progress = progress
        self._timing = regions_of(hooks.profiler) is not None  # else no region per step

    @property
    def param_groups(self) -> list[dict[str, object]]:
        """The optimizer's parameter groups (learning rates and the rest)."""
        groups: list[dict[str, object]] = self.optimizer.param_groups
        return groups

    @property
    def state(self) -> Mapping[torch.Tensor, object]:
        """The optimizer's per-parameter state."""
        return self.optimizer.state

    def step(self, closure: Callable[[], object] | None = None) -> object:
        """Step the optimizer through the strategy (calling ``closure`` first, if given).

        Raises:
            ConfigurationError: Inside ``toggle_model(sync_grad=False)`` or the
                strategy's ``no_sync``: the gradients were never synchronised.
        """
        self._hooks.on_before_optimizer_step(self.optimizer)
        if self._timing:
            with self._hooks.profiler.region("optimizer_step"):
                result = self._strategy.optimizer_step(self.optimizer, closure)
        else:
            result = self._strategy.optimizer_step(self.optimizer, closure)
        self._progress.global_step += 1
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (through the strategy, which may hold them itself)."""
        if set_to_none:
            self._strategy.zero_grad(self.optimizer)
        else:
            self.optimizer.zero_grad(set_to_none=False)

    @contextlib.contextmanager
    def toggle_model(self, sync_grad: bool = True) -> Iterator[None]:
        """Inside, only this optimizer's parameters take gradients.

        With ``sync_grad=False``, backward passes inside accumulate without
        synchronising (the strategy's ``no_sync``). For gradient accumulation by
        hand: run every micro-batch's backward but the last inside
        ``toggle_model(sync_grad=False)``, the last with ``sync_grad=True``, then `step`.
        """
        self._module.toggle_optimizer(self)
        try:
            with self._strategy.no_sync(self._wrapped, enabled=not sync_grad):
                yield
        finally:
            self._module.untoggle_optimizer(self)

    def state_dict(self) -> dict[str, object]:
        """The optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        """Load the optimizer's state dict."""
        self.optimizer.load_state_dict(state_dict)

    @override
    def __repr__(self) -> str:
        return f"TrainerOptimizer({self.optimizer!r})"


class ManualOptimization(Optimization):
    """The user's ``training_step`` steps the optimizers (``automatic_optimization = False``).

    The step runs through the strategy's wrapper, as in automatic optimization, so
    that sharded modules gather and logged values are recorded; inside it the user
    calls `Module.manual_backward` and the optimizers' ``step`` as often as they
    like. The trainer does not step the schedulers, clip or accumulate.

    Args:
        strategy: Runs the step.
        attached: The run's wrapper.

    Raises:
        ConfigurationError: With several processes, the strategy cannot run a step
            that makes its own backward passes (it lacks ``manual_optimization``).
    """

    def __init__(self, strategy: Strategy, attached: Attached) -> None:
        self.strategy = strategy
        self.wrapped = attached.wrapped
        self.region = attached.hooks.profiler.region
        self.timing = regions_of(attached.hooks.profiler) is not None  # else no region per batch
        self._context: Callable[[torch.nn.Module], contextlib.AbstractContextManager[None]] | None
        if strategy.world_size == 1:
            self._context = None  # nothing to synchronise: no context to enter per batch
        elif isinstance(strategy, SupportsManualOptimization):
            self._context = strategy.manual_optimization
        else:
            raise ConfigurationError(
                f"{type(strategy).__name__} has no manual_optimization(module): its "
                "gradients might not be synchronised by backward passes run inside the step",
                value=type(strategy).__name__,
                fix="subclass plait.strategies.Strategy (BaseStrategy), or implement "
                "manual_optimization; or use automatic optimization",
            )

    @override
    def run(self, batch: object, batch_idx: int, *, stepping: bool) -> StepOutput:
        if self.timing:
            with self.region("training_step"):
                return self._step(batch, batch_idx)
        if self._context is None:  # one process: the step itself, nothing around it
            return self.strategy.training_step(self.wrapped, batch, batch_idx)  # type: ignore[return-value]
        return self._step(batch, batch_idx)

    def _step(self, batch: object, batch_idx: int) -> StepOutput:
        strategy, wrapped, context = self.strategy, self.wrapped, self._context
        if context is None:
            return strategy.training_step(wrapped, batch, batch_idx)  # type: ignore[return-value]
        with context(wrapped):
            output: StepOutput = strategy.training_step(wrapped, batch, batch_idx)  # type: ignore[assignment]
        return output
