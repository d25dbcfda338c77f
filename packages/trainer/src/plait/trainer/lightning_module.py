"""What a Lightning module's code overrides and calls on `plait.trainer.Module`.

`Module` is built on these, as Lightning's ``LightningModule`` has them: its hooks
under Lightning's names (`ModuleHooks`, each a no-op until overridden; the Trainer
calls only those a module overrides) and the calls of optimization by hand
(`ManualOptimizationCalls`: ``optimizers()``, ``manual_backward``,
``toggle_optimizer``...). `plait.trainer.module` holds the module's own design: its
steps, logging, the mesh and the pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plait.core import ConfigurationError

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    from plait.core import GradientClipAlgorithm
    from plait.core.typing import Checkpoint
    from plait.trainer.optimization import TrainerOptimizer
    from plait.trainer.run_state import Attached
    from plait.trainer.trainer import Trainer
    from plait.trainer.values import StepOutput

__all__ = ["ManualOptimizationCalls", "ModuleHooks"]


class ManualOptimizationCalls(torch.nn.Module):
    """The calls of optimization by hand, as a Lightning module makes them on itself.

    Under ``automatic_optimization = False`` a ``training_step`` gets the run's
    optimizers (`optimizers`), runs the backward pass through the strategy
    (`manual_backward`) and steps them itself; each call raises a
    `ConfigurationError` outside a running fit.
    """

    _trainer: Trainer | None
    _toggled: list[tuple[torch.nn.Parameter, bool]] | None

    def _running(self, what: str) -> Attached:
        trainer = self._trainer  # read as it is (not through `trainer`): called every step
        attached = trainer.attached if trainer is not None else None
        if attached is None:
            raise ConfigurationError(
                f"{what} was called where no run is in progress",
                fix=f"call {what} inside training_step or a hook of a running fit",
            )
        return attached

    def optimizers(self) -> TrainerOptimizer | list[TrainerOptimizer]:
        """The run's optimizers, stepped through the strategy: one, or a list of several.

        Raises:
            ConfigurationError: No fit is running.
        """
        handles = self._running("optimizers()").handles
        return handles[0] if len(handles) == 1 else list(handles)

    def lr_schedulers(
        self,
    ) -> LRScheduler | ReduceLROnPlateau | list[LRScheduler | ReduceLROnPlateau] | None:
        """The run's learning-rate schedulers: none, one, or a list of several.

        Under manual optimization the trainer does not step them: call ``step()``.

        Raises:
            ConfigurationError: No fit is running.
        """
        schedulers = [config.scheduler for config in self._running("lr_schedulers()").schedulers]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor) -> None:
        """Compute the gradients of ``loss`` through the strategy (manual optimization).

        The strategy and its precision run the backward pass: the loss is scaled for
        ``16-mixed``, DeepSpeed's engine runs it, and DDP and FSDP synchronise the
        gradients (not inside ``toggle_model(sync_grad=False)``).

        Raises:
            ConfigurationError: Under automatic optimization (the trainer runs the
                backward pass of the loss ``training_step`` returns), or outside a fit.
        """
        if self.__dict__.get("_automatic_optimization", True):  # automatic_optimization
            raise ConfigurationError(
                "manual_backward was called under automatic optimization: the trainer "
                "runs the backward pass of the loss training_step returns, and would run "
                "a second one",
                value="automatic_optimization=True",
                fix="set self.automatic_optimization = False in __init__ to step the "
                "optimizers yourself, or return the loss and drop manual_backward",
            )
        attached = self._running("manual_backward")
        attached.hooks.on_before_backward(loss)
        attached.hooks.trainer.strategy.backward(loss, attached.wrapped)
        attached.hooks.on_after_backward()

    def toggle_optimizer(self, optimizer: TrainerOptimizer | torch.optim.Optimizer) -> None:
        """Until `untoggle_optimizer`, the other optimizers' parameters take no gradients.

        For several optimizers over parts of one model (a GAN's generator and
        discriminator): a backward pass then leaves the others' gradients alone.
        Both the parameters the optimizers hold and those the module holds now
        are toggled: a sharded module (FSDP) runs its step on gathered copies.

        Raises:
            ConfigurationError: Another optimizer is toggled already, or
                ``optimizer`` is not one of the run's.
        """
        if self._toggled is not None:
            raise ConfigurationError(
                "toggle_optimizer was called while another optimizer is toggled",
                fix="call untoggle_optimizer(optimizer) before toggling the next one",
            )
        handles = self._running("toggle_optimizer").handles
        chosen = _handle_of(optimizer, handles)
        others = [handle for handle in handles if handle is not chosen]
        frozen = set().union(*(h.parameter_names for h in others)) - chosen.parameter_names
        kept = {id(p) for group in chosen.optimizer.param_groups for p in group["params"]}
        saved: dict[int, tuple[torch.nn.Parameter, bool]] = {}

        def freeze(parameter: torch.nn.Parameter) -> None:
            saved.setdefault(id(parameter), (parameter, parameter.requires_grad))
            parameter.requires_grad = False

        for name, parameter in self.named_parameters():  # as the module holds them now
            if name in frozen:
                freeze(parameter)
        for handle in others:  # as the optimizers hold them (shards, for FSDP)
            for group in handle.optimizer.param_groups:
                for parameter in group["params"]:
                    if id(parameter) not in kept:
                        freeze(parameter)
        self._toggled = list(saved.values())

    def untoggle_optimizer(self, optimizer: TrainerOptimizer | torch.optim.Optimizer) -> None:
        """Give every parameter back the ``requires_grad`` it had before `toggle_optimizer`."""
        for parameter, requires_grad in self._toggled or ():
            parameter.requires_grad = requires_grad
        self._toggled = None

    def clip_gradients(
        self,
        optimizer: TrainerOptimizer | torch.optim.Optimizer,
        gradient_clip_val: float,
        gradient_clip_algorithm: GradientClipAlgorithm = "norm",
    ) -> None:
        """Clip ``optimizer``'s gradients through the strategy (manual optimization).

        Raises:
            ConfigurationError: Outside a fit.
        """
        attached = self._running("clip_gradients")
        inner = getattr(optimizer, "optimizer", optimizer)
        assert isinstance(inner, torch.optim.Optimizer)
        attached.hooks.trainer.strategy.clip_gradients(
            attached.wrapped, inner, gradient_clip_val, gradient_clip_algorithm
        )


class ModuleHooks:
    """A module's hooks, under Lightning's names: each a no-op until overridden.

    The Trainer calls a hook only where the module's class overrides it
    (`plait.trainer.module.overrides`); where they run is in the Trainer's guide.
    """

    def prepare_data(self) -> None:
        """Fetch or write data once per job, on global rank 0, before ``setup`` (a hook)."""

    def setup(self, stage: str) -> None:
        """At the start of every run, on every rank, before the module is set up (a hook).

        ``stage`` is ``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``.
        """

    def teardown(self, stage: str) -> None:
        """At the end of every run, however it ends, on every rank (a hook)."""

    def on_fit_start(self) -> None:
        """Once, before the first epoch, on every rank."""

    def on_fit_end(self) -> None:
        """Once, after the last epoch, on every rank."""

    def on_train_start(self) -> None:
        """When the training loop starts (after the sanity check), on every rank."""

    def on_train_end(self) -> None:
        """When the training loop reached its end (not when it failed), on every rank."""

    def on_train_epoch_start(self) -> None:
        """Before each training epoch."""

    def on_train_epoch_end(self) -> None:
        """After each training epoch (and its validation)."""

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        """Before each training batch."""

    def on_train_batch_end(self, outputs: StepOutput, batch: object, batch_idx: int) -> None:
        """After each training batch."""

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Before the backward pass of ``loss`` (the Trainer's, or `manual_backward`'s).

        With a pipeline (`pipeline`), at the same place, though its schedule ran the
        backward inside the call already: the batch's gradients are there.
        """

    def on_after_backward(self) -> None:
        """After a backward pass, before the gradients are clipped or stepped with."""

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """After the gradients are final (and clipped), before ``optimizer`` steps."""

    def on_validation_start(self) -> None:
        """Before a validation run (before `on_validation_epoch_start`)."""

    def on_validation_end(self) -> None:
        """After a validation run, its values folded into ``trainer.callback_metrics``."""

    def on_validation_epoch_start(self) -> None:
        """Before each validation run."""

    def on_validation_epoch_end(self) -> None:
        """After each validation run; logged epoch values are not folded yet."""

    def on_test_start(self) -> None:
        """Before the test run (before `on_test_epoch_start`)."""

    def on_test_end(self) -> None:
        """After the test run, its values folded into ``trainer.callback_metrics``."""

    def on_test_epoch_start(self) -> None:
        """Before the test run."""

    def on_test_epoch_end(self) -> None:
        """After the test run."""

    def on_predict_start(self) -> None:
        """Before the predict run."""

    def on_predict_end(self) -> None:
        """After the predict run."""

    def on_save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Add to (or change) ``checkpoint`` before it is written."""

    def on_load_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Read what `on_save_checkpoint` added, before the state is restored."""


def _handle_of(
    optimizer: TrainerOptimizer | torch.optim.Optimizer, handles: list[TrainerOptimizer]
) -> TrainerOptimizer:
    for handle in handles:
        if optimizer is handle or optimizer is handle.optimizer:
            return handle
    raise ConfigurationError(
        f"{type(optimizer).__name__} is not one of the run's optimizers",
        value=optimizer,
        fix="pass an optimizer from self.optimizers()",
    )
