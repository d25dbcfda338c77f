"""The hook API: a `Callback` is told of every event of a run and may keep state."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from plait.core.typing import Checkpoint, StateDict
    from plait.trainer.module import Module
    from plait.trainer.trainer import Trainer
    from plait.trainer.values import StepOutput

__all__ = ["Callback"]


class Callback:
    """Code that runs at the events of a run; override the hooks you need.

    Hooks run on every rank, in the order the callbacks were given (checkpoint
    callbacks last, so that they save the others' latest state). A callback with
    state to resume returns it from `state_dict`; it is saved under `state_key`.
    """

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint: its class name by default.

        Two callbacks of one class with state need distinct keys: override it.
        """
        return type(self).__qualname__

    def state_dict(self) -> StateDict:
        """The state to save in checkpoints (nothing by default)."""
        return {}

    def load_state_dict(self, state_dict: StateDict) -> None:
        """Restore what `state_dict` returned."""

    def setup(self, trainer: Trainer, module: Module, stage: str) -> None:
        """When a run of ``stage`` (``"fit"``, ``"validate"``, ...) starts, on every rank."""

    def teardown(self, trainer: Trainer, module: Module, stage: str) -> None:
        """When a run of ``stage`` ends, even after an error."""

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        """Before the first training epoch."""

    def on_fit_end(self, trainer: Trainer, module: Module) -> None:
        """After the last training epoch."""

    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        """When the training loop starts (after the sanity check)."""

    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        """When the training loop reached its end (not when it failed)."""

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        """Before each training epoch."""

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """After each training epoch, its epoch metrics folded."""

    def on_train_batch_start(
        self, trainer: Trainer, module: Module, batch: object, batch_idx: int
    ) -> None:
        """Before each training batch."""

    def on_train_batch_end(
        self,
        trainer: Trainer,
        module: Module,
        outputs: StepOutput,
        batch: object,
        batch_idx: int,
    ) -> None:
        """After each training batch (and the optimizer step, when one was taken)."""

    def on_before_backward(self, trainer: Trainer, module: Module, loss: torch.Tensor) -> None:
        """Before the backward pass of ``loss``."""

    def on_after_backward(self, trainer: Trainer, module: Module) -> None:
        """After a backward pass, before the gradients are clipped or stepped with."""

    def on_before_optimizer_step(
        self, trainer: Trainer, module: Module, optimizer: torch.optim.Optimizer
    ) -> None:
        """After gradients are ready (and clipped), before the optimizer steps."""

    def on_validation_start(self, trainer: Trainer, module: Module) -> None:
        """Before a validation run."""

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        """After a validation run, its metrics folded into ``trainer.callback_metrics``."""

    def on_validation_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        """After each validation batch."""

    def on_test_start(self, trainer: Trainer, module: Module) -> None:
        """Before the test run."""

    def on_test_end(self, trainer: Trainer, module: Module) -> None:
        """After the test run."""

    def on_test_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        """After each test batch."""

    def on_predict_start(self, trainer: Trainer, module: Module) -> None:
        """Before the predict run."""

    def on_predict_end(self, trainer: Trainer, module: Module) -> None:
        """After the predict run."""

    def on_predict_batch_end(
        self, trainer: Trainer, module: Module, outputs: object, batch: object, batch_idx: int
    ) -> None:
        """After each prediction batch."""

    def on_save_checkpoint(self, trainer: Trainer, module: Module, checkpoint: Checkpoint) -> None:
        """Before ``checkpoint`` is written; change it in place if needed."""

    def on_load_checkpoint(self, trainer: Trainer, module: Module, checkpoint: Checkpoint) -> None:
        """After ``checkpoint`` is read, before anything is restored from it."""

    def on_exception(self, trainer: Trainer, module: Module, exception: BaseException) -> None:
        """When the run fails with ``exception`` (on the rank where it was raised)."""
