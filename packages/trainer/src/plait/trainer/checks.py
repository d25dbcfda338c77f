"""Checks of settings as users give them (any object), with errors that say what to write."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from plait.core import ConfigurationError
from plait.trainer.module import DataModule, Module, overrides

if TYPE_CHECKING:
    from plait.core.typing import PathLike

__all__ = [
    "check_count",
    "check_data",
    "check_manual_optimization",
    "check_module",
    "check_number",
    "check_root",
    "check_timeout",
    "compile_options",
]


def check_count(name: str, value: object, *, minimum: int, example: str) -> int:
    """``value`` as an int of at least ``minimum`` (a bool is not a count).

    Raises:
        ConfigurationError: It is not one; the message names it and shows ``example``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(
            f"{name}={value!r} must be an int of at least {minimum}",
            value=value,
            fix=f"pass e.g. {example}",
        )
    return value


def check_number(name: str, value: object, *, positive: bool, example: str) -> float:
    """``value`` as a finite float, above 0 when ``positive``, else at least 0.

    Raises:
        ConfigurationError: It is not one.
    """
    bad = isinstance(value, bool) or not isinstance(value, int | float)
    if not bad:
        assert isinstance(value, int | float)
        bad = not math.isfinite(value) or value < 0 or (positive and value == 0)
    if bad:
        least = "above 0" if positive else "at least 0"
        raise ConfigurationError(
            f"{name}={value!r} must be a finite number {least}",
            value=value,
            fix=f"pass e.g. {example}",
        )
    return float(value)  # type: ignore[arg-type]


def check_timeout(name: str, value: object) -> timedelta:
    """``value`` (seconds, or a `timedelta`) as a positive `timedelta`.

    Raises:
        ConfigurationError: It is neither, or not above 0.
    """
    if not isinstance(value, timedelta):
        return timedelta(seconds=check_number(name, value, positive=True, example=f"{name}=600"))
    if value <= timedelta(0):
        raise ConfigurationError(
            f"{name}={value!r} must be positive", value=value, fix=f"pass e.g. {name}=600"
        )
    return value


_COMPILE_OPTIONS: Final = ("fullgraph", "dynamic", "backend", "mode", "options", "disable")


def compile_options(value: object) -> dict[str, object] | None:
    """``torch.compile``'s keyword arguments, from ``True``, ``False`` or a mapping of them.

    Raises:
        ConfigurationError: Neither a bool nor a mapping of ``torch.compile``'s options.
    """
    if value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        unknown = sorted(set(value) - set(_COMPILE_OPTIONS))
        if unknown:
            raise ConfigurationError.invalid_choice("compile option", unknown[0], _COMPILE_OPTIONS)
        return dict(value)
    raise ConfigurationError(
        f"compile={value!r} is neither a bool nor a dict of torch.compile's options",
        value=value,
        fix="pass compile=True, or e.g. compile={'mode': 'max-autotune'}",
    )


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


def check_root(root: PathLike | None, *, writes: bool) -> str:
    """The root directory as a string; when ``writes``, made and found writable now."""
    path = os.fspath(root) if root else os.getcwd()
    if not writes or "://" in path:
        return path  # a URL: its filesystem says what is allowed when it is written
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise ConfigurationError(
            f"default_root_dir={path!r} cannot hold logs and checkpoints: "
            f"{error.strerror or error}",
            value=path,
            fix="pass a directory you can write to, e.g. default_root_dir='runs'",
        ) from None
    return path
