"""Checks of the module and the data a stage is given, with errors that say what to write."""

from __future__ import annotations

from plait.core import ConfigurationError
from plait.trainer.module import DataModule, Module, overrides

__all__ = ["check_data", "check_manual_optimization", "check_module"]


def check_module(model: object, needed: tuple[str, ...]) -> None:
    """Refuse a model that is not a `Module`, or lacks one of the methods ``needed``.

    Raises:
        ConfigurationError: It is torch.compile's wrapper, not a `Module`, or lacks a method.
    """
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, Module) and not isinstance(model, Module):
        raise ConfigurationError(
            f"the model is torch.compile's wrapper around {type(inner).__name__}, whose "
            "parameter names (_orig_mod.*) no checkpoint of the module would match",
            value=type(model).__name__,
            fix="pass the module itself and Trainer(compile=True) (or "
            "compile={'mode': ...}), or compile it in place with model.compile(...)",
        )
    if not isinstance(model, Module):
        raise ConfigurationError(
            f"the model is a {type(model).__name__}, not a plait.trainer.Module",
            value=type(model).__name__,
            fix="subclass plait.trainer.Module (a torch.nn.Module with training_step "
            "and configure_optimizers)",
        )
    missing = [name for name in needed if not overrides(model, name)]
    if missing:
        raise ConfigurationError(
            f"{type(model).__name__} does not define {', '.join(missing)}",
            value=missing,
            fix=f"define {', '.join(missing)} in {type(model).__name__}",
        )


def check_manual_optimization(
    model: Module, *, gradient_clip_val: float | None, accumulate_grad_batches: int
) -> None:
    """Refuse the Trainer's clipping and accumulation for a module that steps itself.

    Raises:
        ConfigurationError: Either is set, with manual optimization.
    """
    if model.automatic_optimization:
        return
    if gradient_clip_val is not None:
        raise ConfigurationError(
            f"gradient_clip_val={gradient_clip_val} clips in automatic optimization "
            f"only, and {type(model).__name__} steps its optimizers itself",
            value=gradient_clip_val,
            fix="clip in training_step before each step, with "
            "self.clip_gradients(optimizer, gradient_clip_val=...), and drop the "
            "Trainer's gradient_clip_val",
        )
    if accumulate_grad_batches > 1:
        raise ConfigurationError(
            f"accumulate_grad_batches={accumulate_grad_batches} accumulates in "
            f"automatic optimization only, and {type(model).__name__} steps its "
            "optimizers itself",
            value=accumulate_grad_batches,
            fix="accumulate by hand: run the backward passes before the last inside "
            "optimizer.toggle_model(sync_grad=False), step every n batches, and drop "
            "the Trainer's accumulate_grad_batches",
        )


def check_data(loaders: object, datamodule: DataModule | None, method: str, stage: str) -> None:
    """Refuse a stage given both loaders and a datamodule, or no data at all.

    Raises:
        ConfigurationError: Both, neither, or a datamodule that is not a `DataModule`.
    """
    if loaders is not None and datamodule is not None:
        raise ConfigurationError(
            f"{stage} got both loaders and a datamodule",
            fix="pass one of them",
        )
    if datamodule is not None and not isinstance(datamodule, DataModule):
        raise ConfigurationError(
            f"datamodule is a {type(datamodule).__name__}, not a plait.trainer.DataModule",
            value=datamodule,
            fix="subclass plait.trainer.DataModule",
        )
    if loaders is None and (datamodule is None or not datamodule.has(method)):
        raise ConfigurationError(
            f"{stage} has no data: no loader was given"
            + ("" if datamodule is None else f" and the datamodule has no {method}()"),
            fix=f"pass a DataLoader, or a DataModule that defines {method}()",
        )
