"""A module's hyperparameters: its ``__init__`` arguments, saved with it and used to rebuild it."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

import torch

from plait.core import CheckpointError, ConfigurationError, rank_zero_warn
from plait.strategies.export import read_whole

if TYPE_CHECKING:
    from plait.core.typing import PathLike
    from plait.trainer.module import Module

__all__ = [
    "caller_arguments",
    "class_path",
    "init_arguments",
    "load_module",
    "saved",
    "storable",
]

M = TypeVar("M", bound="Module")


def class_path(cls: type[object]) -> str:
    """Where a class is defined, as ``package.module.Class``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def init_arguments(
    frame: FrameType, names: Sequence[str], ignore: Sequence[str]
) -> dict[str, object]:
    """The arguments the ``__init__`` running in ``frame`` was called with.

    ``*args`` cannot be told apart by name and are left out; ``**kwargs`` are
    included by their own names (unless its name is in ``ignore``).

    Raises:
        ConfigurationError: ``names`` holds a name that is not an argument.
    """
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    positional = list(code.co_varnames[:count])
    values = {name: frame.f_locals[name] for name in positional if name in frame.f_locals}
    flags = code.co_flags
    index = count + (1 if flags & inspect.CO_VARARGS else 0)
    if flags & inspect.CO_VARKEYWORDS and code.co_varnames[index] not in ignore:
        extra = frame.f_locals.get(code.co_varnames[index], {})
        if isinstance(extra, Mapping):
            values.update(extra)
    values.pop("self", None)
    values.pop("__class__", None)
    unknown = sorted(set(names) - set(values))
    if unknown:
        raise ConfigurationError(
            f"save_hyperparameters({', '.join(map(repr, unknown))}): not arguments of "
            f"{code.co_qualname}",
            value=unknown,
            choices=sorted(values),
            fix="name arguments of __init__, or call save_hyperparameters() for all of them",
        )
    chosen = names or list(values)
    return {name: values[name] for name in chosen if name not in set(ignore)}


def caller_arguments(names: Sequence[str], ignore: Sequence[str] | str) -> dict[str, object]:
    """The arguments of the ``__init__`` that called ``save_hyperparameters``, checked.

    Modules among them (a ``net`` argument, say) are kept, with a warning: their
    weights are the state dict's, so checkpoints and loggers leave them out (`saved`),
    and `load_from_checkpoint` takes them again by name. Every other value must be
    plain data (`storable`).

    Raises:
        ConfigurationError: A name is not an argument, or a value is not plain data.
    """
    frame = inspect.currentframe()
    # This function, then save_hyperparameters, then the __init__ that called it.
    caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    if caller is None:  # pragma: no cover - only without Python frames
        raise ConfigurationError(
            "save_hyperparameters cannot see the arguments of its caller",
            fix="pass them to self.hparams.update(...) yourself",
        )
    ignored = [ignore] if isinstance(ignore, str) else list(ignore)
    values = init_arguments(caller, names, ignored)
    del frame, caller
    modules = sorted(name for name, value in values.items() if isinstance(value, torch.nn.Module))
    if modules:
        shown = ", ".join(repr(name) for name in modules)
        rank_zero_warn(
            f"the hyperparameter(s) {shown} are modules: kept in self.hparams, left out of "
            "checkpoints and logs (their weights are in the state dict); pass them to "
            f"load_from_checkpoint(path, {modules[0]}=...), or save_hyperparameters("
            f"ignore=[{shown}]) to keep them out of hparams too"
        )
    storable(saved(values))
    return values


def saved(hparams: Mapping[str, object]) -> dict[str, object]:
    """What checkpoints and loggers hold of ``hparams``: all but modules."""
    return {
        name: value for name, value in hparams.items() if not isinstance(value, torch.nn.Module)
    }


def storable(values: Mapping[str, object]) -> None:
    """Refuse a value a checkpoint cannot hold as plain data (it loads ``weights_only``).

    Raises:
        ConfigurationError: A value is not a number, string, bool, ``None``, or a
            list, tuple or string-keyed dict of them.
    """
    for name, value in values.items():
        if not _plain(value):
            raise ConfigurationError(
                f"the hyperparameter {name!r} is a {type(value).__name__}, which a "
                "checkpoint does not hold as plain data (checkpoints load with "
                "weights_only=True)",
                value=name,
                fix=f"save_hyperparameters(ignore=[{name!r}]) and pass it to "
                f"load_from_checkpoint(path, {name}=...), or save what builds it "
                "(its sizes, its name)",
            )


def _plain(value: object) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item) for key, item in value.items())
    return False


def load_module(
    cls: type[M],
    path: PathLike,
    *,
    map_location: str | torch.device | None,
    strict: bool,
    overrides: Mapping[str, object],
) -> M:
    """``cls`` made from a checkpoint's hyperparameters, its weights loaded, in this process.

    Reads any checkpoint plait writes (one file, a ``torch.distributed.checkpoint``
    directory of shards, a DeepSpeed directory) whole, without a process group.

    Raises:
        CheckpointError: It cannot be read, or holds no module state.
        ConfigurationError: It is a checkpoint of another class, an argument of
            ``__init__`` is neither saved nor given, or ``map_location`` is not a
            device.
    """
    device = _device(map_location)
    name = os.fspath(path)
    if not os.path.exists(name) and "://" not in name:
        raise CheckpointError(name, "does not exist", fix="pass the path of a checkpoint")
    checkpoint = read_whole(path, optimizers=False)
    state = checkpoint.get("state_dict")
    if not isinstance(state, Mapping):
        raise CheckpointError(
            name,
            "holds no module state ('state_dict')",
            fix="pass a checkpoint written by a Trainer (ModelCheckpoint or save_checkpoint)",
        )
    saved_class = (checkpoint.get("plait") or {}).get("module")
    # By the class's name: a script's classes live in __main__ when it runs.
    if saved_class is not None and saved_class.rsplit(".", 1)[-1] != cls.__name__:
        raise ConfigurationError(
            f"{name} is a checkpoint of {saved_class}, not of {class_path(cls)}",
            value=saved_class,
            fix=f"call {saved_class.rsplit('.', 1)[-1]}.load_from_checkpoint(path), or load "
            "its 'state_dict' into your module yourself",
        )
    arguments = {**dict(checkpoint.get("hyper_parameters") or {}), **overrides}
    try:
        module = cls(**arguments)
    except TypeError as error:
        raise ConfigurationError(
            f"{cls.__name__}({', '.join(arguments)}) cannot be made from the checkpoint's "
            f"hyperparameters: {error}",
            value=sorted(arguments),
            fix="pass the arguments it lacks: load_from_checkpoint(path, name=value), "
            "or call self.save_hyperparameters() in __init__",
        ) from None
    if set(state) - set(module.state_dict()):
        # Layers the run made in configure_model: made here too.
        module.configure_model()
    module.load_state_dict(state, strict=strict)
    if device is not None:
        module.to(device)
    module.eval()
    return module


def _device(map_location: object) -> torch.device | None:
    if map_location is None:
        return None
    if isinstance(map_location, torch.device):
        return map_location
    if isinstance(map_location, str):
        try:
            return torch.device(map_location)
        except RuntimeError:
            pass
    raise ConfigurationError(
        f"map_location={map_location!r} is not a device",
        value=map_location,
        fix="pass a device: map_location='cpu', 'cuda:0' or torch.device(...)",
    )
