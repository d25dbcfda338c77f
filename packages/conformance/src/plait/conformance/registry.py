"""The kinds of example the ranks can run, by case type: `EXAMPLE_KINDS`."""

from __future__ import annotations

import inspect
import os
import threading
from typing import TYPE_CHECKING, Final, cast

import attrs

from plait.conformance.kind import C, ExampleKind
from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.conformance.kind import Property

__all__ = ["EXAMPLE_KINDS", "KindRegistry"]


@attrs.frozen
class _Entry:
    kind: object  # an ExampleKind of case_type
    case_type: type
    properties: tuple[Property, ...]
    module: str
    files: frozenset[str]  # of the kind's class and the kinds it builds on


def _files(kind: ExampleKind[C]) -> frozenset[str]:
    files = set()
    for cls in type(kind).__mro__:
        if not issubclass(cls, ExampleKind):
            continue
        try:
            found = inspect.getsourcefile(cls)
        except TypeError:  # defined where no file is (an interactive session)
            found = None
        if found is not None:
            files.add(os.path.realpath(found))
    return frozenset(files)


class KindRegistry:
    """Each case type and the `ExampleKind` that answers for its examples.

    A case type is registered once, with one kind, and a property name belongs to
    one kind: the registry refuses a second.

    Example:
        >>> from plait.conformance import EXAMPLE_KINDS, ReduceCase
        >>> EXAMPLE_KINDS.property("reduce_numbers").name
        'reduce_numbers'
        >>> ReduceCase in EXAMPLE_KINDS
        True
    """

    def __init__(self) -> None:
        self._entries: dict[type, _Entry] = {}
        self._lock = threading.Lock()

    def register(self, kind: ExampleKind[C]) -> ExampleKind[C]:
        """Make ``kind`` the one for its case type; returns it.

        Raises:
            ConfigurationError: ``kind`` is not an `ExampleKind`, its case type is not
                a frozen attrs class, or the type or one of its property names is
                registered already.
        """
        if not isinstance(kind, ExampleKind):
            raise ConfigurationError(
                f"{kind!r} is a {type(kind).__name__}, not an ExampleKind",
                value=kind,
                fix="subclass plait.conformance.ExampleKind (or CollectiveKind) and "
                "register an instance",
            )
        case_type = getattr(kind, "case_type", None)
        if not isinstance(case_type, type) or not attrs.has(case_type):
            raise ConfigurationError(
                f"{type(kind).__name__}.case_type is {case_type!r}, not an attrs class: a "
                "case is a frozen value that pickles to the ranks and whose repr rebuilds it",
                value=case_type,
                fix=f"set {type(kind).__name__}.case_type to a class decorated with @attrs.frozen",
            )
        properties = tuple(getattr(kind, "properties", ()))
        if not properties:
            raise ConfigurationError(
                f"{type(kind).__name__} names no property its examples belong to",
                value=kind,
                fix=f"set {type(kind).__name__}.properties = (Property(name, contract, ...),)",
            )
        module = type(kind).__module__
        files = _files(kind)
        with self._lock:
            held = self._entries.get(case_type)
            if held is not None:
                raise ConfigurationError(
                    f"{case_type.__qualname__} is already the case type of "
                    f"{type(held.kind).__name__} (from {held.module})",
                    value=kind,
                    fix="give the new kind a case type of its own",
                )
            names = {
                prop.name: entry for entry in self._entries.values() for prop in entry.properties
            }
            for prop in properties:
                other = names.get(prop.name)
                if other is not None:
                    raise ConfigurationError(
                        f"the property {prop.name!r} of {type(kind).__name__} is already "
                        f"{type(other.kind).__name__}'s (from {other.module})",
                        value=prop.name,
                        fix="name the property anew",
                    )
            self._entries[case_type] = _Entry(kind, case_type, properties, module, files)
        return kind

    def kind_of(self, case: C) -> ExampleKind[C]:
        """The kind that answers for ``case``.

        Raises:
            ConfigurationError: No kind is registered for its type (the registered
                case types are listed).
        """
        entry = self._entries.get(type(case))
        if entry is None:
            known = sorted(kind.__qualname__ for kind in self._entries)
            raise ConfigurationError(
                f"no kind of example is registered for {type(case).__qualname__}",
                value=case,
                choices=known,
                fix="register its ExampleKind with plait.conformance.EXAMPLE_KINDS.register "
                "in the module that defines the case type",
            )
        # Registered for exactly this type, so of this case type.
        return cast("ExampleKind[C]", entry.kind)

    def property(self, name: str) -> Property:
        """The registered property named ``name``.

        Raises:
            ConfigurationError: No kind has a property of that name.
        """
        found = {prop.name: prop for prop in self.properties()}
        if name not in found:
            raise ConfigurationError.invalid_choice(
                "property", name, list(found), fix="name a property of a registered kind"
            )
        return found[name]

    def properties(self) -> list[Property]:
        """Every registered property, in the order their kinds were registered."""
        return [prop for entry in list(self._entries.values()) for prop in entry.properties]

    def case_types(self) -> list[type]:
        """Every registered case type, in the order their kinds were registered."""
        return list(self._entries)

    def files(self) -> frozenset[str]:
        """The source files of the registered kinds (and those they build on), resolved.

        Where a rank's own calls of the strategy are made: a stuck rank's stack is
        read for the innermost of them.
        """
        return frozenset().union(*(entry.files for entry in self._entries.values()))

    def __contains__(self, case_type: object) -> bool:
        return case_type in self._entries


EXAMPLE_KINDS: Final = KindRegistry()
"""The kinds of example every pool knows: the collective contract's, the training
kit's, and those your packages register."""
