"""Parts written the way Lightning writes them, read through plait's Protocols.

A cluster environment of Lightning's kind answers with methods (``world_size()``,
``global_rank()``, ``set_world_size(n)``) where plait's Protocol has properties; an
accelerator of Lightning's kind has static methods whose results are counts or
lists (``parse_devices(2) -> 2``) where plait's give device indices. Both pass an
``isinstance`` check of the Protocol, so each is adapted where it comes in
(`as_cluster_environment`, `as_accelerator`): a value it cannot read is refused
there, naming the method and what it returned.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

from typing_extensions import override

from plait.core.errors import ConfigurationError
from plait.core.protocols import Accelerator, ClusterEnvironment

if TYPE_CHECKING:
    import torch

    from plait.core.typing import DeviceSpec

__all__ = [
    "MethodAccelerator",
    "MethodEnvironment",
    "as_accelerator",
    "as_cluster_environment",
    "is_method_accelerator",
    "is_method_environment",
]

_PLACE = ("world_size", "global_rank", "local_rank", "node_rank")


class _SetsPlace(Protocol):
    def set_world_size(self, size: int) -> None: ...

    def set_global_rank(self, rank: int) -> None: ...


def is_method_environment(value: object) -> bool:
    """Whether ``value`` answers ``world_size`` with a method, as Lightning's environments do."""
    return any(callable(getattr(value, name, None)) for name in _PLACE)


class MethodEnvironment:
    """A cluster environment whose place is given by methods, read as plait's properties.

    Every property calls the wrapped environment's method (or reads its property)
    at each access, as Lightning reads them. Where the environment has
    ``set_world_size`` and ``set_global_rank``, `place` tells it the process's
    place, as Lightning's strategies do before the process group starts.

    Args:
        environment: The environment, with ``world_size()``, ``global_rank()``,
            ``local_rank()``, ``node_rank()`` and the properties ``main_address``,
            ``main_port`` and ``creates_processes_externally``.
    """

    def __init__(self, environment: object) -> None:
        self.environment = environment

    def _read(self, name: str) -> object:
        try:
            value = getattr(self.environment, name)
        except AttributeError:
            raise ConfigurationError(
                f"the cluster environment {self.environment!r} has no {name}",
                value=self.environment,
                fix=f"give {type(self.environment).__name__} a {name} (a method, as "
                "Lightning's ClusterEnvironment has it, or a property)",
            ) from None
        return value() if callable(value) else value

    def _int(self, name: str) -> int:
        value = self._read(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigurationError(
                f"the cluster environment {type(self.environment).__name__}'s {name} gave "
                f"{value!r}, not an int",
                value=value,
                fix=f"return an int from {type(self.environment).__name__}.{name}",
            )
        return value

    def detect(self) -> bool:
        """What the environment's ``detect()`` says."""
        return bool(self._read("detect"))

    @property
    def creates_processes_externally(self) -> bool:
        """What the environment says."""
        return bool(self._read("creates_processes_externally"))

    @property
    def main_address(self) -> str:
        """The environment's ``main_address``."""
        return str(self._read("main_address"))

    @property
    def main_port(self) -> int:
        """The environment's ``main_port``."""
        return self._int("main_port")

    @property
    def world_size(self) -> int:
        """The environment's ``world_size()``."""
        return self._int("world_size")

    @property
    def global_rank(self) -> int:
        """The environment's ``global_rank()``."""
        return self._int("global_rank")

    @property
    def local_rank(self) -> int:
        """The environment's ``local_rank()``."""
        return self._int("local_rank")

    @property
    def node_rank(self) -> int:
        """The environment's ``node_rank()``."""
        return self._int("node_rank")

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """The environment's ``validate_settings``, where it has one."""
        validate = getattr(self.environment, "validate_settings", None)
        if callable(validate):
            validate(num_devices=num_devices, num_nodes=num_nodes)

    def place(self, world_size: int, global_rank: int) -> None:
        """Tell the environment the process's place, where it takes one (``set_*``)."""
        if callable(getattr(self.environment, "set_world_size", None)) and callable(
            getattr(self.environment, "set_global_rank", None)
        ):
            settable = cast("_SetsPlace", self.environment)
            settable.set_world_size(world_size)
            settable.set_global_rank(global_rank)

    def teardown(self) -> None:
        """The environment's ``teardown()``, where it has one."""
        teardown = getattr(self.environment, "teardown", None)
        if callable(teardown):
            teardown()

    @override
    def __repr__(self) -> str:
        return f"MethodEnvironment({self.environment!r})"


def as_cluster_environment(value: object) -> ClusterEnvironment | None:
    """``value`` as a `ClusterEnvironment`: as it is, adapted, or ``None`` if it is not one.

    An environment of Lightning's kind (`is_method_environment`) comes back as a
    `MethodEnvironment`.
    """
    if isinstance(value, MethodEnvironment):
        return value
    if is_method_environment(value):
        return MethodEnvironment(value)
    return value if isinstance(value, ClusterEnvironment) else None


def is_method_accelerator(value: object) -> bool:
    """Whether ``value`` is an accelerator of Lightning's kind.

    Its ``parse_devices`` is a static method (Lightning declares it so), or it has
    no ``name``.
    """
    if not callable(getattr(value, "parse_devices", None)):
        return False
    static = isinstance(inspect.getattr_static(type(value), "parse_devices", None), staticmethod)
    return static or not isinstance(getattr(value, "name", None), str)


def _name_of(kind: type) -> str:
    name = kind.__name__.removesuffix("Accelerator") or kind.__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class MethodAccelerator:
    """An accelerator of Lightning's kind, read as plait's `Accelerator`.

    ``parse_devices`` may give a count, a list of indices or a string of them (as
    Lightning's do); the result is turned into indices, and `get_parallel_devices`
    hands the wrapped accelerator back what its own ``parse_devices`` gave.

    Args:
        accelerator: The accelerator. Without a ``name`` its class names it
            (``MyChipAccelerator`` -> ``"my_chip"``).
    """

    def __init__(self, accelerator: object) -> None:
        self.accelerator = accelerator
        own = getattr(accelerator, "name", None)
        self._name = own if isinstance(own, str) else _name_of(type(accelerator))
        self._parsed: dict[tuple[int, ...], object] = {}

    @property
    def name(self) -> str:
        """The accelerator's ``name``, or one its class gives."""
        return self._name

    def _call(self, method: str, *args: object) -> object:
        function = getattr(self.accelerator, method, None)
        if not callable(function):
            raise ConfigurationError(
                f"the accelerator {self.accelerator!r} has no {method}()",
                value=self.accelerator,
                fix=f"give {type(self.accelerator).__name__} a {method} method, as "
                "Lightning's Accelerator declares it",
            )
        return function(*args)

    def is_available(self) -> bool:
        """The accelerator's ``is_available()``."""
        return bool(self._call("is_available"))

    def auto_device_count(self) -> int:
        """The accelerator's ``auto_device_count()``."""
        count = self._call("auto_device_count")
        if isinstance(count, bool) or not isinstance(count, int):
            raise self._bad("auto_device_count", count, "an int")
        return count

    def parse_devices(self, spec: DeviceSpec) -> tuple[int, ...]:
        """The accelerator's ``parse_devices(spec)``, as device indices."""
        parsed = self._call("parse_devices", spec)
        indices = self._indices(parsed)
        self._parsed[indices] = parsed
        return indices

    def _indices(self, parsed: object) -> tuple[int, ...]:
        if isinstance(parsed, bool):
            raise self._bad("parse_devices", parsed, "a count or a list of device indices")
        if isinstance(parsed, int):
            return tuple(range(parsed))
        if isinstance(parsed, str):
            text = parsed.strip()
            if text.isdigit():
                return tuple(range(int(text)))
            parts = [part.strip() for part in text.split(",") if part.strip()]
            if parts and all(part.isdigit() for part in parts):
                return tuple(int(part) for part in parts)
        elif isinstance(parsed, Sequence) and all(
            isinstance(item, int) and not isinstance(item, bool) for item in parsed
        ):
            return tuple(cast("Sequence[int]", parsed))
        raise self._bad("parse_devices", parsed, "a count or a list of device indices")

    def get_parallel_devices(self, devices: tuple[int, ...]) -> list[torch.device]:
        """The accelerator's devices for ``devices``, given as its ``parse_devices`` gave them."""
        given = self._parsed.get(devices, list(devices))
        found = self._call("get_parallel_devices", given)
        if not isinstance(found, Sequence) or isinstance(found, str):
            raise self._bad("get_parallel_devices", found, "a list of torch.device")
        return list(cast("Sequence[torch.device]", found))

    def setup_device(self, device: torch.device) -> None:
        """The accelerator's ``setup_device(device)``."""
        self._call("setup_device", device)

    def teardown(self) -> None:
        """The accelerator's ``teardown()``."""
        self._call("teardown")

    def get_device_stats(self, device: torch.device) -> dict[str, float]:
        """The accelerator's ``get_device_stats(device)``, or none where it has no such method."""
        if not callable(getattr(self.accelerator, "get_device_stats", None)):
            return {}
        stats = self._call("get_device_stats", device)
        return dict(cast("dict[str, float]", stats)) if isinstance(stats, dict) else {}

    def _bad(self, method: str, value: object, wanted: str) -> ConfigurationError:
        return ConfigurationError(
            f"the accelerator {type(self.accelerator).__name__}'s {method} gave {value!r}, "
            f"not {wanted}",
            value=value,
            fix=f"return {wanted} from {type(self.accelerator).__name__}.{method}",
        )

    @override
    def __repr__(self) -> str:
        return f"MethodAccelerator({self.accelerator!r})"


def as_accelerator(value: object) -> Accelerator | None:
    """``value`` as an `Accelerator`: as it is, adapted, or ``None`` if it is not one.

    An accelerator of Lightning's kind (`is_method_accelerator`) comes back as a
    `MethodAccelerator`.
    """
    if isinstance(value, MethodAccelerator):
        return value
    if is_method_accelerator(value):
        return MethodAccelerator(value)
    return value if isinstance(value, Accelerator) else None
