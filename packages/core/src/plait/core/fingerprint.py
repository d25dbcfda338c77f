"""What a rank called: the value that ranks compare before a checked collective."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = ["CollectiveCall"]


def _non_empty(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value:
        raise ValueError(f"{attribute.name} must be a non-empty string")


def _params(value: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    # Parameters are kept as text, sorted by name: equal calls compare equal whatever
    # the order the caller listed them in, and the value pickles and hashes cheaply.
    return tuple(sorted((str(key), str(item)) for key, item in value.items()))


@attrs.frozen
class CollectiveCall:
    """One rank's call of a collective, with the parameters that must agree across ranks.

    Example:
        >>> CollectiveCall("reduce", {"op": "sum", "dtype": "torch.float32"}).describe()
        'reduce(dtype=torch.float32, op=sum)'
    """

    collective: str = attrs.field(validator=[attrs.validators.instance_of(str), _non_empty])
    params: tuple[tuple[str, str], ...] = attrs.field(factory=dict, converter=_params)

    def describe(self) -> str:
        """Render the call as ``name(key=value, ...)``."""
        inner = ", ".join(f"{key}={value}" for key, value in self.params)
        return f"{self.collective}({inner})"
