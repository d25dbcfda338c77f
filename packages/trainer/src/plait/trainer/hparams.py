"""A module's hyperparameters: its ``__init__`` arguments, saved with it and used to rebuild it."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import torch
from typing_extensions import override

from plait.core import CheckpointError, ConfigurationError, rank_zero_warn
from plait.strategies.export import read_whole

if TYPE_CHECKING:
    from plait.core.typing import PathLike

__all__ = [
    "NOT_PLAIN",
    "HyperParameters",
    "SavesHyperParameters",
    "caller_arguments",
    "class_path",
    "init_arguments",
    "load_module",
    "plain_form",
    "saved",
]


class _Loadable(Protocol):
    """What `load_module` needs of the class it makes: a module with layers made on demand."""

    def configure_model(self) -> None: ...

    def state_dict(self) -> Mapping[str, object]: ...

    def load_state_dict(self, state_dict: Mapping[str, object], strict: bool = True) -> object: ...

    def to(self, device: torch.device) -> object: ...

    def eval(self) -> object: ...


M = TypeVar("M", bound=_Loadable)


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

    Values that are not plain data (a ``net`` module, an optimizer factory Hydra made
    with ``_partial_: true``) are kept, with a warning: checkpoints and loggers leave
    them out (`saved`), and `load_from_checkpoint` takes them again by name.
    Hydra's ``ListConfig`` and ``DictConfig`` are plain data: saved as lists and dicts.

    Raises:
        ConfigurationError: A name is not an argument.
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
    objects = sorted(name for name, value in values.items() if plain_form(value) is NOT_PLAIN)
    if objects:
        shown = ", ".join(repr(name) for name in objects)
        modules = all(isinstance(values[name], torch.nn.Module) for name in objects)
        kinds = ", ".join(sorted({type(values[name]).__name__ for name in objects}))
        what = "are modules" if modules else f"are not plain data ({kinds})"
        why = (
            "their weights are in the state dict"
            if modules
            else "checkpoints load with weights_only=True"
        )
        rank_zero_warn(
            f"the hyperparameter(s) {shown} {what}: kept in self.hparams, left out of "
            f"checkpoints and logs ({why}); pass them to load_from_checkpoint(path, "
            f"{objects[0]}=...), or save_hyperparameters(ignore=[{shown}]) to keep them "
            "out of hparams too"
        )
    return values


def saved(hparams: Mapping[str, object]) -> dict[str, object]:
    """What checkpoints and loggers hold of ``hparams``: its plain data, as plain data.

    A module, an optimizer factory or another object is left out; Hydra's
    ``ListConfig`` and ``DictConfig`` become lists and dicts, their interpolations
    resolved.
    """
    kept: dict[str, object] = {}
    for name, value in hparams.items():
        plain = plain_form(value)
        if plain is not NOT_PLAIN:
            kept[name] = plain
    return kept


NOT_PLAIN: Final = object()
"""What `plain_form` gives for a value that is not plain data."""


def plain_form(value: object) -> object:
    """``value`` as plain data, or `NOT_PLAIN` where it is not.

    Plain data is numbers, strings, bools, ``None``, and lists, tuples and
    string-keyed dicts of them. An OmegaConf container (what Hydra gives a class it
    makes) becomes the lists and dicts it holds; omegaconf is never imported here,
    only recognised once loaded.
    """
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(value, omegaconf.Container):
        value = omegaconf.OmegaConf.to_container(value, resolve=True)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        items = [plain_form(item) for item in value]
        if any(item is NOT_PLAIN for item in items):
            return NOT_PLAIN
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            return NOT_PLAIN
        entries = {key: plain_form(item) for key, item in value.items()}
        return NOT_PLAIN if any(item is NOT_PLAIN for item in entries.values()) else entries
    return NOT_PLAIN


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


class HyperParameters(dict[str, object]):
    """A module's hyperparameters: a dict whose items read as attributes too (``hparams.lr``)."""

    # Any: each value has the type the user gave it, which no annotation here knows.
    def __getattr__(self, name: str) -> Any:
        """The item ``name``.

        Raises:
            AttributeError: There is no such hyperparameter.
        """
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"no hyperparameter {name!r}; saved: {', '.join(sorted(self)) or 'none'}"
            ) from None

    @override
    def __setattr__(self, name: str, value: object) -> None:
        self[name] = value


class SavesHyperParameters:
    """``save_hyperparameters`` and ``hparams``, as a `Module` and a `DataModule` have them."""

    def save_hyperparameters(
        self, *names: str, ignore: Sequence[str] | str = (), logger: bool = True
    ) -> None:
        """Save the calling ``__init__``'s arguments as `hparams`, in checkpoints and logs.

        Call it in ``__init__``: the arguments (all, or those named; less those in
        ``ignore``) become `hparams`, go into every checkpoint (so that
        `Module.load_from_checkpoint` can make the module again; a data module's as
        ``"datamodule_hyper_parameters"``) and, with ``logger``, to the loggers'
        ``log_hyperparams`` when a run starts (a module's and a data module's
        together: a name both hold with different values is refused).

        A module among them (a ``net`` argument) is kept in `hparams` with a warning,
        and left out of checkpoints and logs (its weights are the state dict's):
        pass it to `Module.load_from_checkpoint` again.

        Raises:
            ConfigurationError: A name is not an argument, or a value is not plain
                data (numbers, strings, lists, dicts) nor a module: ignore it and
                pass it to `Module.load_from_checkpoint` instead.
        """
        self.hparams.update(caller_arguments(names, ignore))
        # Through __dict__: a torch module's attribute setting is its own.
        self.__dict__["_log_hyperparams"] = logger

    @property
    def hparams(self) -> HyperParameters:
        """The hyperparameters `save_hyperparameters` saved (empty by default)."""
        found = self.__dict__.get("_hparams")
        if found is None:
            found = self.__dict__["_hparams"] = HyperParameters()
        assert isinstance(found, HyperParameters)
        return found

    @property
    def logs_hyperparameters(self) -> bool:
        """Whether the loggers get the hyperparameters (``save_hyperparameters(logger=...)``)."""
        return bool(self.__dict__.get("_log_hyperparams", True)) and bool(self.hparams)
