"""The strategy under test: a registered name, a reference to a factory, or the factory."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeAlias

import attrs

from plait.core import ConfigurationError, Strategy, StrategyRegistry

__all__ = ["StrategyFactory", "StrategyTarget"]

StrategyFactory: TypeAlias = Callable[[], Strategy]
"""What builds the strategy in each rank, called with no arguments."""


_MISSING = object()


def _load_file(path: Path) -> object:
    name = "_plait_conformance_target_" + re.sub(r"\W", "_", str(path))
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ConfigurationError(
                f"cannot load {str(path)!r} as a Python module",
                value=str(path),
                fix="point at a .py file",
            )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def _colon_hint(name: str) -> str | None:
    """``"package.module:factory"`` for a dotted name whose module can be imported."""
    where, dot, last = name.rpartition(".")
    if not dot or not where or not last.isidentifier():
        return None
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError):
        return None
    return f"{where}:{last}" if found is not None else None


def _resolve(owner: object, where: str, qualname: str, reference: str) -> object:
    found = owner
    within = where
    for part in qualname.split("."):
        inside = found
        found = getattr(inside, part, _MISSING)
        if found is _MISSING:
            names = [name for name in dir(inside) if not name.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1, cutoff=0.6)
            prefix = qualname[: qualname.index(part)]
            fix = (
                f"write '{where}:{prefix}{close[0]}'"
                if close
                else f"name a factory that {within} defines: '{where}:<factory>'"
            )
            raise ConfigurationError(
                f"{reference!r}: {within} has no attribute {part!r}",
                value=reference,
                suggestion=f"{where}:{prefix}{close[0]}" if close else None,
                fix=fix,
            )
        within = f"{within}.{part}"
    return found


def _sizes(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen
class StrategyTarget:
    """The strategy a rank pool builds: how to find its factory, and what to call it.

    ``spec`` is one of:

    - a name in `plait.core.StrategyRegistry`, e.g. ``"ddp"`` (built with
      ``StrategyRegistry.get(name)``);
    - ``"package.module:factory"``, the form of an entry point;
    - ``"path/to/file.py:factory"``.

    The factory is called with no arguments in every rank, after the variables of
    ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``, ...) and ``PLAIT_CONFORMANCE_BACKEND`` are set. With a ``mesh``
    (the sizes of a device mesh's dimensions, outermost first) it is called with
    ``mesh_shape=mesh``, and must build a strategy whose ``device_mesh`` has that
    shape (see `plait.conformance.ConformanceSuite.meshes`).

    Example:
        >>> StrategyTarget.of("my_pkg.strategies:make_strategy").name
        'my_pkg.strategies:make_strategy'
    """

    spec: str = attrs.field(validator=attrs.validators.instance_of(str))
    mesh: tuple[int, ...] = attrs.field(default=(), converter=_sizes)

    @mesh.validator
    def _check_mesh(self, _: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]) -> None:
        if not all(type(size) is int and size >= 1 for size in value):
            raise ConfigurationError(
                f"mesh={value!r} must list the sizes of the mesh's dimensions, each a positive int",
                value=value,
                fix="pass e.g. mesh=(2, 2) for 2 data-parallel groups of 2 tensor-parallel ranks",
            )

    def __attrs_post_init__(self) -> None:
        if not self.spec.strip():
            raise ConfigurationError(
                "the strategy to test is empty",
                value=self.spec,
                fix="pass a registered name such as 'ddp', or 'package.module:factory'",
            )

    @classmethod
    def of(cls, value: str | StrategyFactory | StrategyTarget) -> StrategyTarget:
        """The target of a name, a reference, or a module-level factory function or class.

        Raises:
            ConfigurationError: ``value`` is a lambda or a nested function, which a
                rank process cannot find, or not a string or callable at all.
        """
        if isinstance(value, StrategyTarget):
            return value
        if isinstance(value, str):
            return cls(value)
        if not callable(value):
            raise ConfigurationError(
                f"the strategy to test is {value!r}, a {type(value).__name__}",
                value=value,
                fix="pass a registered name, 'package.module:factory', or the factory itself",
            )
        qualname = getattr(value, "__qualname__", "")
        if not qualname or "<" in qualname:
            raise ConfigurationError(
                f"the factory {value!r} is not defined at module level, so a rank process "
                "cannot import it",
                value=value,
                fix="define the factory with def at the top level of a module",
            )
        return cls(f"{inspect.getfile(value)}:{qualname}")

    @property
    def name(self) -> str:
        """The spec, shortened to the file's name for a path."""
        if ":" in self.spec:
            where, _, qualname = self.spec.rpartition(":")
            if where.endswith(".py"):
                return f"{Path(where).stem}:{qualname}"
        return self.spec

    def modules(self) -> list[str]:
        """The modules the factory lives in, worth importing once before ranks start."""
        if ":" not in self.spec:
            if self.spec not in StrategyRegistry:
                return []
            module = getattr(StrategyRegistry.entry(self.spec).factory, "__module__", None)
            return [module] if isinstance(module, str) else []
        where = self.spec.rpartition(":")[0]
        return [] if where.endswith(".py") or "/" in where else [where]

    def factory(self) -> StrategyFactory:
        """The callable that builds the strategy (importing what it names).

        Raises:
            ConfigurationError: The name is not registered, or the reference cannot
                be found or is not callable.
        """
        if ":" not in self.spec:
            name = self.spec
            try:
                StrategyRegistry.entry(name)  # raises with the registered names
            except ConfigurationError as error:
                hint = _colon_hint(name)
                if hint is None:
                    raise
                raise ConfigurationError(
                    f"{name!r} is not a registered strategy; a reference to a factory "
                    f"separates the module from the name with a colon",
                    value=name,
                    fix=f"write {hint!r}",
                ) from error
            return lambda: StrategyRegistry.get(name)
        where, _, qualname = self.spec.rpartition(":")
        if where.endswith(".py") or "/" in where:
            path = Path(where)
            if not path.is_file():
                raise ConfigurationError(
                    f"{self.spec!r}: no file {where!r}",
                    value=self.spec,
                    fix="give the path of an existing .py file, relative to where pytest runs",
                )
            owner = _load_file(path.resolve())
        else:
            try:
                owner = importlib.import_module(where)
            except ImportError as error:
                raise ConfigurationError(
                    f"{self.spec!r}: cannot import {where!r}: {error}",
                    value=self.spec,
                    fix="install the package that provides it, or fix the module path",
                ) from error
        found = _resolve(owner, where, qualname, self.spec)
        if not callable(found):
            raise ConfigurationError(
                f"{self.spec!r} is a {type(found).__name__}, not a callable",
                value=self.spec,
                fix="point at a function or class that builds the strategy",
            )
        return found

    def build(self) -> Strategy:
        """Build the strategy and check that it is a `plait.core.Strategy`.

        Raises:
            ConfigurationError: The factory returned something else, or a class
                instead of an instance of it.
        """
        factory: Callable[..., Strategy] = self.factory()
        if not self.mesh:
            strategy = factory()
        else:
            try:
                inspect.signature(factory).bind(mesh_shape=self.mesh)
            except TypeError:
                raise ConfigurationError(
                    f"{self.spec!r} takes no mesh_shape argument, so it cannot be tested on "
                    f"the mesh {self.mesh}",
                    value=self.spec,
                    fix="give the factory a mesh_shape parameter (the sizes of the mesh's "
                    "dimensions) and build the strategy's device mesh with that shape",
                ) from None
            except ValueError:  # no signature to read (a builtin): let the call decide
                pass
            strategy = factory(mesh_shape=self.mesh)
        if isinstance(strategy, type):
            raise ConfigurationError(
                f"{self.spec!r} returned the class {strategy.__qualname__}, not a strategy "
                "made from it",
                value=strategy,
                fix=f"return {strategy.__qualname__}(...) from the factory",
            )
        if not isinstance(strategy, Strategy):
            raise ConfigurationError(
                f"{self.spec!r} built {strategy!r}, which is not a plait.core.Strategy",
                value=strategy,
                fix="return an object that implements the Strategy protocol of plait.core",
            )
        return strategy
