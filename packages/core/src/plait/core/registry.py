"""A typed registry of named factories, filled at run time and from entry points.

Each registry maps a case-normalised name to a factory, the keyword arguments to call
it with, and a description. Installed distributions add to it through an entry-point
group: each entry point names a *registration hook*, a callable that receives the
registry and registers what its package provides. Entry points are loaded on the
first use of the registry, never at import.
"""

from __future__ import annotations

import contextvars
import difflib
import inspect
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Generic, TypeVar, cast, overload

import attrs
from typing_extensions import get_protocol_members, is_protocol, override

from plait.core.errors import ConfigurationError, MissingDependencyError, suggest

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["Registry", "RegistryEntry"]

T = TypeVar("T")
FactoryT = TypeVar("FactoryT", bound=Callable[..., object])

RUNTIME_SOURCE = "<runtime>"

# Names are typed in configuration files and on command lines, and compared without
# case: ASCII keeps that comparison exact (Unicode case mappings do not round-trip).
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")

# The distribution whose registration hook is running, so that its entries record
# where they came from; entries registered outside a hook come from the running program.
_registering_source: contextvars.ContextVar[str] = contextvars.ContextVar(
    "plait_registering_source", default=RUNTIME_SOURCE
)


def _frozen_params(value: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(value))


@attrs.frozen(eq=False)
class RegistryEntry(Generic[T]):
    """One registered name; entries compare by identity.

    Attributes:
        name: The normalised name (lower case, no surrounding whitespace).
        init_params: Keyword arguments the factory is called with.
        description: One line for listings.
        source: The distribution that registered it, or ``"<runtime>"``.
        reference: ``"module:attribute"`` for a factory registered by reference
            (`Registry.register_lazily`), imported on first use; else ``None``.
    """

    name: str
    _factory: Callable[..., T] | None = attrs.field(alias="factory")
    init_params: Mapping[str, object] = attrs.field(factory=dict, converter=_frozen_params)
    description: str = ""
    source: str = RUNTIME_SOURCE
    reference: str | None = None
    # Checks a factory imported by reference as `Registry.register` checks one.
    _check: Callable[[Callable[..., object]], None] | None = attrs.field(
        default=None, alias="check", repr=False
    )

    @property
    def factory(self) -> Callable[..., T]:
        """What builds the object: a class or any callable.

        A factory registered by reference is imported (and checked) here, the first
        time it is asked for.

        Raises:
            ConfigurationError: The reference names nothing importable, or what it
                names is not a factory the registry takes.
        """
        found = self._factory
        if found is None:
            found = self._resolve()
        return found

    def _resolve(self) -> Callable[..., T]:
        assert self.reference is not None
        module, _, attribute = self.reference.partition(":")
        import importlib  # noqa: PLC0415 - only an entry registered by reference needs it

        try:
            found = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise ConfigurationError(
                f"{self.name!r} is registered as {self.reference!r}, which cannot be "
                f"imported: {type(error).__name__}: {error}",
                value=self.reference,
                fix=f"fix or reinstall {self.source}",
            ) from error
        if self._check is not None:
            self._check(found)
        # Frozen to its users; resolved once, then the same factory for every lookup.
        object.__setattr__(self, "_factory", found)
        return cast("Callable[..., T]", found)


class Registry(Generic[T]):
    """Names mapped to factories of one kind of part (strategy, accelerator, ...).

    Args:
        kind: What the registry holds, in the singular, for messages: ``"strategy"``.
        protocol: The Protocol every registered object must meet. Classes are checked
            at registration; other factories when they build an object.
        entry_point_group: The entry-point group to load on first use, if any.
        distribution: The distribution that provides the built-in entries, named in
            the error when a lookup misses because it is not installed.

    Example:
        >>> registry = Registry[object]("widget", protocol=object)
        >>> registry.register("Plain", object, description="the simplest widget")
        <class 'object'>
        >>> "plain" in registry
        True
    """

    def __init__(
        self,
        kind: str,
        *,
        protocol: type,
        entry_point_group: str | None = None,
        distribution: str | None = None,
    ) -> None:
        self.kind = kind
        self.protocol = protocol
        self.entry_point_group = entry_point_group
        self.distribution = distribution
        self._members: frozenset[str] = (
            get_protocol_members(protocol) if is_protocol(protocol) else frozenset()
        )
        # A class can be checked for the protocol's methods only: its data members
        # (properties, attributes) may be set per instance, so they are checked on the
        # objects the factory builds.
        self._methods = frozenset(
            member
            for member in self._members
            if inspect.isfunction(getattr(protocol, member, None))
        )
        self._entries: dict[str, RegistryEntry[T]] = {}
        # Re-entrant: registration hooks call register() while entry points load.
        self._lock = threading.RLock()
        self._loaded = entry_point_group is None
        # A plugin that failed to load fails every lookup, not only the first one.
        self._load_error: ConfigurationError | None = None

    @overload
    def register(
        self,
        name: str,
        factory: FactoryT,
        /,
        *,
        description: str = "",
        override: bool = False,
        **init_params: object,
    ) -> FactoryT: ...

    @overload
    def register(
        self,
        name: str,
        factory: None = None,
        /,
        *,
        description: str = "",
        override: bool = False,
        **init_params: object,
    ) -> Callable[[FactoryT], FactoryT]: ...

    def register(
        self,
        name: str,
        factory: FactoryT | None = None,
        /,
        *,
        description: str = "",
        override: bool = False,
        **init_params: object,
    ) -> FactoryT | Callable[[FactoryT], FactoryT]:
        """Register ``factory`` under ``name``, to be called with ``init_params``.

        Names are made of ASCII letters, digits, ``_``, ``-`` and ``.``, and are
        compared case-insensitively (``"DDP"`` is ``"ddp"``). It returns the
        factory; without one it is a decorator, as Lightning's registries are::

            @StrategyRegistry.register("ddp_quiet", description="DDP, no hooks")
            class QuietDDP(DDPStrategy): ...

        Raises:
            ConfigurationError: The name is empty, has other characters, or is taken
                (pass ``override=True`` to replace it); the factory is not callable,
                is a class that lacks methods of the protocol (they are named), or
                does not accept ``init_params``.
        """
        if factory is None:

            def decorate(given: FactoryT) -> FactoryT:
                return self.register(
                    name, given, description=description, override=override, **init_params
                )

            return decorate
        self._register(name, factory, description=description, override=override, **init_params)
        return factory

    def _register(
        self,
        name: str,
        factory: Callable[..., object],
        /,
        *,
        description: str,
        override: bool,
        **init_params: object,
    ) -> None:
        key = self._normalise(name)
        self._check_factory(key, factory, init_params)
        self._add(
            key,
            RegistryEntry(
                name=key,
                # Checked against the protocol (_check_factory), or when it builds.
                factory=cast("Callable[..., T]", factory),
                init_params=init_params,
                description=description,
                source=_registering_source.get(),
            ),
            override=override,
            given=name,
        )

    def _add(self, key: str, entry: RegistryEntry[T], *, override: bool, given: str) -> None:
        with self._lock:
            self._ensure_loaded()
            existing = self._entries.get(key)
            if existing is not None and not override:
                # What it is, without importing a factory registered by reference.
                held = existing.description or existing.reference or existing.factory
                raise ConfigurationError(
                    f"{self.kind} {key!r} is already registered (from {existing.source}: {held!r})",
                    value=given,
                    fix=f"choose another name, or pass override=True to replace the {self.kind}",
                )
            self._entries[key] = entry

    def register_lazily(
        self,
        name: str,
        reference: str,
        /,
        *,
        description: str = "",
        override: bool = False,
        **init_params: object,
    ) -> None:
        """Register the factory at ``reference`` (``"package.module:attribute"``) unimported.

        The name is listed, found and described at once; the module is imported, and
        its factory checked as `register` checks one, only when the entry's factory is
        first asked for (`get`, ``entry(name).factory``). A package registers the parts
        a process may never use this way, so that looking up another does not import
        them.

        Raises:
            ConfigurationError: The name is malformed or taken (see `register`), or
                ``reference`` is not ``"module:attribute"``.
        """
        module, colon, attribute = reference.partition(":")
        if not (colon and module and attribute.isidentifier()):
            raise ConfigurationError(
                f"the reference {reference!r} of {self.kind} {name!r} is not "
                "'package.module:attribute'",
                value=reference,
                fix="write the module and the factory's name, separated by a colon",
            )
        key = self._normalise(name)

        def check(factory: Callable[..., object]) -> None:
            self._check_factory(key, factory, init_params)

        self._add(
            key,
            RegistryEntry(
                name=key,
                factory=None,
                init_params=init_params,
                description=description,
                source=_registering_source.get(),
                reference=reference,
                check=check,
            ),
            override=override,
            given=name,
        )

    def get(self, name: str, /, **overrides: object) -> T:
        """Build the object registered as ``name``.

        Args:
            name: The registered name, in any case.
            **overrides: Keyword arguments that replace or add to the registered ones.

        Raises:
            ConfigurationError: No such name (the message lists the available ones
                and the closest), or the built object does not meet the protocol.
            MissingDependencyError: The name is unknown and the distribution that
                provides the built-in ones is not installed.
        """
        entry = self.entry(name)
        if overrides:
            self._check_options(entry.name, entry.factory, overrides, given="given")
        built = entry.factory(**{**entry.init_params, **overrides})
        if self._members:
            missing = self._missing_members(set(dir(built)))
            if missing:
                raise ConfigurationError(
                    f"the factory of {self.kind} {entry.name!r} built a "
                    f"{type(built).__qualname__}, which is not a {self.protocol.__name__}: "
                    f"it lacks {', '.join(missing)}",
                    value=built,
                    fix=f"implement {', '.join(missing)} on {type(built).__qualname__}",
                )
        return built

    def entry(self, name: str) -> RegistryEntry[T]:
        """The entry registered as ``name``, without building anything.

        Raises:
            ConfigurationError: See `get`.
            MissingDependencyError: See `get`.
        """
        key = self._normalise(name)
        with self._lock:
            self._ensure_loaded()
            entry = self._entries.get(key)
            if entry is not None:
                return entry
            available = sorted(self._entries)
        if self.distribution is not None and not _is_installed(self.distribution):
            raise MissingDependencyError(
                feature=f"the {self.kind} {key!r}", install=self.distribution
            )
        raise ConfigurationError(
            f"no {self.kind} named {name!r} is registered",
            value=name,
            choices=available,
            suggestion=suggest(key, available),
            fix="use one of the registered names, or register yours first "
            "(see available() and register())",
        )

    def remove(self, name: str) -> None:
        """Remove ``name`` from the registry.

        Raises:
            ConfigurationError: No such name.
        """
        key = self._normalise(name)
        with self._lock:
            self.entry(key)
            del self._entries[key]

    def available(self) -> list[str]:
        """The registered names, sorted."""
        with self._lock:
            self._ensure_loaded()
            return sorted(self._entries)

    def entries(self) -> list[RegistryEntry[T]]:
        """Every entry, sorted by name."""
        with self._lock:
            self._ensure_loaded()
            return [self._entries[name] for name in sorted(self._entries)]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or not _NAME.fullmatch(name.strip()):
            return False
        with self._lock:
            self._ensure_loaded()
            return name.strip().lower() in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.available())

    def __len__(self) -> int:
        return len(self.available())

    @override
    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, entry_point_group={self.entry_point_group!r})"

    def _normalise(self, name: object) -> str:
        if not isinstance(name, str) or not _NAME.fullmatch(name.strip()):
            raise ConfigurationError(
                f"a {self.kind} name must be a non-empty string of ASCII letters, digits, "
                f"'_', '-' and '.', got {name!r}",
                value=name,
                fix=f"name the {self.kind} with a word such as 'my_{self.kind.replace(' ', '_')}'",
            )
        return name.strip().lower()

    def _missing_members(self, present: set[str], *, methods_only: bool = False) -> list[str]:
        required = self._methods if methods_only else self._members
        return sorted(required - present)

    def _check_factory(self, key: str, factory: object, init_params: Mapping[str, object]) -> None:
        if not callable(factory):
            raise ConfigurationError(
                f"the factory of {self.kind} {key!r} must be callable, "
                f"got {type(factory).__name__}",
                value=factory,
                fix="pass the class itself, or a function that builds the object",
            )
        if isinstance(factory, type) and self._members:
            missing = self._missing_members(set(dir(factory)), methods_only=True)
            if missing:
                raise ConfigurationError(
                    f"{factory.__qualname__} cannot be registered as a {self.kind}: "
                    f"it does not implement the {self.protocol.__name__} protocol "
                    f"(missing: {', '.join(missing)})",
                    value=factory,
                    fix=f"implement {', '.join(missing)} on {factory.__qualname__}",
                )
        self._check_options(key, factory, init_params, given="registered with")

    def _check_options(
        self, key: str, factory: Callable[..., object], options: Mapping[str, object], *, given: str
    ) -> None:
        """Refuse options ``factory`` does not take, naming the closest it does."""
        try:
            signature = inspect.signature(factory)
        except (TypeError, ValueError):
            return  # Some builtins have no signature to check against.
        try:
            signature.bind_partial(**options)
        except TypeError as error:
            parameters = signature.parameters
            takes = sorted(
                name
                for name, parameter in parameters.items()
                if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)
            )
            unknown = sorted(name for name in options if name not in takes)
            close = {
                name: found[0]
                for name in unknown
                for found in [difflib.get_close_matches(name, takes, n=1)]
                if found
            }
            first = unknown[0] if unknown else None
            raise ConfigurationError(
                f"{self.kind} {key!r} was {given} "
                + (
                    f"the option{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(f'{name}=' for name in unknown)}, which its factory does not take"
                    if unknown
                    else f"options its factory cannot take: {error}"
                ),
                value=dict(options),
                choices=takes,
                suggestion=close.get(first) if first is not None else None,
                fix=(
                    "; ".join(f"write {found}= for {name}=" for name, found in close.items())
                    or "pass only keyword arguments the factory takes"
                ),
            ) from None

    def _ensure_loaded(self) -> None:
        # Called with the lock held.
        if self._load_error is not None:
            raise self._load_error
        if self._loaded:
            return
        self._loaded = True
        assert self.entry_point_group is not None
        # Imported here, not at module level: it costs a fifth of importing plait.core,
        # and only a registry's first use needs it.
        import importlib.metadata  # noqa: PLC0415

        try:
            for entry_point in importlib.metadata.entry_points(group=self.entry_point_group):
                self._load_entry_point(entry_point)
        except ConfigurationError as error:
            self._load_error = error
            raise

    def _load_entry_point(self, entry_point: EntryPoint) -> None:
        source = entry_point.dist.name if entry_point.dist is not None else entry_point.value
        described = f"entry point {entry_point.name} = {entry_point.value} (from {source})"
        try:
            hook = entry_point.load()
        except Exception as error:
            raise ConfigurationError(
                f"the {described} in group {self.entry_point_group!r} failed to load: "
                f"{type(error).__name__}: {error}",
                value=entry_point.value,
                fix=f"fix or uninstall {source}",
            ) from error
        if not callable(hook):
            raise ConfigurationError(
                f"the {described} is not a registration hook: "
                f"it is a {type(hook).__name__}, not a callable taking the registry",
                value=entry_point.value,
                fix=f"point the entry point at a function `def register(registry): ...` "
                f"in {source}",
            )
        token = _registering_source.set(source)
        try:
            hook(self)
        except Exception as error:
            raise ConfigurationError(
                f"the registration hook of the {described} raised {type(error).__name__}: {error}",
                value=entry_point.value,
                fix=f"fix or uninstall {source}",
            ) from error
        finally:
            _registering_source.reset(token)


def _is_installed(distribution: str) -> bool:
    import importlib.metadata  # noqa: PLC0415 (see Registry._ensure_loaded)

    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
