"""A strategy remembers the arguments it was made with: it pickles as them and is remade."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType

from typing_extensions import Self, override

from plait.core import ConfigurationError

__all__ = ["Remakeable", "accepts"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def accepts(factory: Callable[..., object], argument: str) -> bool:
    """Whether ``factory`` takes the keyword ``argument`` (or any keyword).

    A factory whose signature cannot be read (a builtin) takes none.
    """
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    parameter = parameters.get(argument)
    if parameter is not None:
        return parameter.kind is not inspect.Parameter.POSITIONAL_ONLY
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _rebuild(
    factory: Callable[..., Remakeable], args: tuple[object, ...], kwargs: dict[str, object]
) -> Remakeable:
    return factory(*args, **kwargs)


class Remakeable:
    """An object that records its constructor's arguments, as given, whatever its signature.

    It pickles as them, so that a rank in another process makes it anew and finds
    its own place, and `replace` makes a copy with some of them changed.
    """

    _arguments: tuple[tuple[object, ...], dict[str, object]]

    def __new__(cls, *args: object, **kwargs: object) -> Self:
        """Record the arguments as given, whatever the subclass's signature."""
        instance = super().__new__(cls)
        given = dict(kwargs)
        if "precision_plugin" in given and "precision" not in given:
            # Recorded under the one name the strategy is remade with.
            given["precision"] = given.pop("precision_plugin")
        instance._arguments = (args, given)
        return instance

    @override
    def __reduce__(self) -> tuple[object, ...]:
        args, kwargs = self._arguments
        return (_rebuild, (type(self), args, kwargs))

    def _positional_names(self) -> list[str]:
        parameters = inspect.signature(type(self)).parameters.values()
        return [parameter.name for parameter in parameters if parameter.kind in _POSITIONAL]

    @property
    def arguments(self) -> Mapping[str, object]:
        """The keyword arguments the strategy was made with (positional ones by name)."""
        args, kwargs = self._arguments
        named = dict(zip(self._positional_names(), args, strict=False))
        return MappingProxyType({**named, **kwargs})

    def accepts(self, argument: str) -> bool:
        """Whether the constructor takes the keyword ``argument`` (or any keyword)."""
        return accepts(type(self), argument)

    def replace(self, **changes: object) -> Self:
        """A new strategy of this class, made with `arguments` and ``changes``.

        Raises:
            ConfigurationError: The constructor does not take one of ``changes``.
        """
        args, kwargs = self._changed(changes)
        factory: Callable[..., Self] = type(self)
        return factory(*args, **kwargs)

    def remake_in_place(self, **changes: object) -> None:
        """Make this object anew with `arguments` and ``changes``, as `replace` would.

        For a part assigned before the object is used (``strategy.accelerator =
        ...``, as Lightning code does): every check of the constructor runs again,
        and the recorded arguments change with it, so that a rank in another
        process is made with the part too. A copy is made first, so that a change
        the constructor refuses leaves this object as it was.

        Raises:
            ConfigurationError: The constructor does not take one of ``changes``,
                or refuses them.
        """
        self.replace(**changes)  # refused here, before anything of this object changes
        args, kwargs = self._changed(changes)
        type(self).__init__(self, *args, **kwargs)
        self._arguments = (tuple(args), kwargs)

    def _changed(self, changes: dict[str, object]) -> tuple[list[object], dict[str, object]]:
        for name in changes:
            if not self.accepts(name):
                raise ConfigurationError(
                    f"{type(self).__qualname__} cannot be made with {name}=: its constructor "
                    "does not take it",
                    value=name,
                    fix=f"accept {name} (or **kwargs) in {type(self).__qualname__}.__init__ "
                    "and pass it on to the base class",
                )
        args, kwargs = self._arguments
        names = self._positional_names()
        given = list(args)
        changes = dict(changes)
        for index, name in enumerate(names[: len(args)]):
            if name in changes:
                given[index] = changes.pop(name)
        return given, {**kwargs, **changes}
