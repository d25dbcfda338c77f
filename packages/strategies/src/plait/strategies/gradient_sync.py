"""When a strategy's gradients are synchronised: accumulation, closures, manual optimization.

`GradientSync` is the collaborator every strategy holds (`BaseStrategy.gradient_sync`):
it runs the backward passes of an accumulation window without synchronising
(`no_sync`), refuses an optimizer step inside such a window, refuses an optimizer
that steps with a closure where the strategy cannot run one, and says what manual
optimization needs. The strategy supplies only what its wrapper does: the context
that stops its backward from synchronising (``skip_gradient_sync``), and, where it
shards or its wrapper arms synchronisation in its forward, its own
``check_closure_optimizer`` and ``manual_optimization``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn, Protocol

from plait.core import ConfigurationError

if TYPE_CHECKING:
    import torch

    from plait.core import Precision

__all__ = ["GradientSync", "GradientSyncHost", "refuse_closure_optimizer"]


class GradientSyncHost(Protocol):
    """What `GradientSync` needs of its strategy."""

    @property
    def precision(self) -> Precision:
        """The precision plugin (a gradient scaler cannot step an optimizer's closure)."""
        ...

    def skip_gradient_sync(
        self, module: torch.nn.Module
    ) -> contextlib.AbstractContextManager[None]:
        """The context that stops ``module``'s backward from synchronising gradients."""
        ...


def refuse_closure_optimizer(optimizer: torch.optim.Optimizer, why: str) -> NoReturn:
    """Raise the error of a strategy that cannot step ``optimizer`` with a closure.

    Raises:
        ConfigurationError: Always: ``optimizer`` steps with a closure, and ``why``
            says why this strategy cannot run it.
    """
    raise ConfigurationError(
        f"{type(optimizer).__name__} steps with a closure and decides from the whole "
        f"parameters and gradients, and {why}",
        value=type(optimizer).__name__,
        fix="train it with strategy='ddp' (or one process), or use an optimizer "
        "without a closure (Adam, SGD, ...)",
    )


class GradientSync:
    """Accumulation windows, and the optimizers and steps a strategy can synchronise.

    Args:
        strategy: The strategy whose gradients it synchronises.

    Attributes:
        depth: How many `no_sync` blocks are open (read on every optimizer step).
    """

    def __init__(self, strategy: GradientSyncHost) -> None:
        self._strategy = strategy
        self.depth = 0

    @contextlib.contextmanager
    def no_sync(self, module: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
        """Backward passes inside the block accumulate gradients without synchronising.

        Every strategy has it, so one loop accumulates on any of them: run the
        backward of every micro-batch but the last inside it, then the last one's
        outside, then step. Where the gradients are not synchronised at backward
        (one process; DeepSpeed, whose engine reduces at its step; XLA replicas,
        which average at the step) it changes nothing. ``enabled=False`` makes it
        no block at all, for a loop that writes ``no_sync(model, enabled=not last)``.

        Args:
            module: The module `setup_module` returned.
            enabled: Whether to skip synchronisation.

        Raises:
            ConfigurationError: ``module`` is not the one the strategy set up (the
                block would silently synchronise), or the optimizer is stepped
                inside the block (its gradients were never synchronised).
        """
        if not enabled:
            yield
            return
        with self._strategy.skip_gradient_sync(module):
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1

    def check_not_accumulating(self) -> None:
        """Refuse to step while a `no_sync` block is open.

        Raises:
            ConfigurationError: A `no_sync` block is open.
        """
        if self.depth:
            raise ConfigurationError(
                "optimizer_step was called inside no_sync: the gradients of this step "
                "were never synchronised across the ranks, and stepping on them would "
                "let the replicas drift apart",
                value="optimizer_step",
                fix="run the last micro-batch's backward after the no_sync block, then "
                "step outside it (or no_sync(model, enabled=not last_micro_batch))",
            )

    def check_closure_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse to step ``optimizer`` with a closure (LBFGS's way) where it cannot work.

        Such an optimizer evaluates the closure several times per step and decides
        from the loss and the gradients it sees: it works where every rank holds
        the whole parameters and the same gradients (one process, DDP), and the
        loss is not scaled. A strategy that shards them overrides its
        ``check_closure_optimizer`` to refuse (`refuse_closure_optimizer`).

        Raises:
            ConfigurationError: The precision scales the loss (``16-mixed``).
        """
        precision = self._strategy.precision
        if precision.needs_scaler:
            raise ConfigurationError(
                f"{type(optimizer).__name__} steps with a closure, and the gradient scaler "
                f"of {precision!r} cannot step an optimizer that calls one itself",
                value=type(optimizer).__name__,
                fix="use precision='bf16-mixed' or '32-true' with it, or an optimizer "
                "without a closure",
            )

    @contextlib.contextmanager
    def manual_optimization(self, module: torch.nn.Module) -> Iterator[None]:
        """Inside, a step run through ``module`` runs its own backward passes and steps.

        A trainer's manual optimization runs the user's whole step (forward, any
        number of `backward` passes, `optimizer_step` calls) inside the wrapper's
        forward. Nothing to change by default: a strategy whose gradients are
        synchronised by hooks of the backward pass itself (FSDP), in the step
        (DeepSpeed, XLA), or not at all (one process) syncs as it always does. DDP,
        whose forward arms the all-reduce, overrides its ``manual_optimization``.
        """
        del module
        yield
