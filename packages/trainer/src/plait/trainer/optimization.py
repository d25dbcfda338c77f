"""How a training batch becomes an optimizer step: forward, backward, clip, step, schedule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau
from typing_extensions import override

from plait.core import ConfigurationError, GradientClipAlgorithm, Strategy

if TYPE_CHECKING:
    from plait.trainer.attach import Attached
    from plait.trainer.hooks import Hooks
    from plait.trainer.module import StepOutput
    from plait.trainer.optim import SchedulerConfig
    from plait.trainer.progress import Progress
    from plait.trainer.results import Results

__all__ = [
    "AutomaticOptimization",
    "Optimization",
    "Schedulers",
    "is_step_batch",
    "training_loss",
]


def is_step_batch(batch_idx: int, accumulate: int, total: int) -> bool:
    """Whether batch ``batch_idx`` of an epoch of ``total`` (0: unknown) ends with a step."""
    return (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == total


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

    @override
    def run(self, batch: object, batch_idx: int, *, stepping: bool) -> StepOutput:
        if stepping:  # the usual batch: no context, and no (slow) Protocol check
            output = self._forward_backward(batch, batch_idx)
            self._optimizer_step()
            return output
        # Between optimizer steps, gradients accumulate without synchronisation.
        with self.strategy.no_sync(self.wrapped):
            return self._forward_backward(batch, batch_idx)

    def _forward_backward(self, batch: object, batch_idx: int) -> StepOutput:
        strategy, wrapped = self.strategy, self.wrapped
        output: StepOutput = strategy.training_step(wrapped, batch, batch_idx)  # type: ignore[assignment]
        loss = training_loss(output, self.world_size)
        if loss is not None:
            if self.accumulate > 1:
                loss = loss / self.accumulate
            strategy.backward(loss, wrapped)
        return output

    def _optimizer_step(self) -> None:
        strategy, wrapped = self.strategy, self.wrapped
        for optimizer in self.optimizers:
            if self.clip_val is not None:
                strategy.clip_gradients(wrapped, optimizer, self.clip_val, self.clip_algorithm)
            self.hooks.on_before_optimizer_step(optimizer)
            strategy.optimizer_step(optimizer)
            strategy.zero_grad(optimizer)
        self.progress.global_step += 1
        self.schedulers.step("step")
