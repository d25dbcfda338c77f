"""What every cluster environment shares: ranks, rendezvous, and their checks."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import ClassVar

import attrs
from typing_extensions import Self, override

from plait.core import ConfigurationError
from plait.environments.variables import all_present

__all__ = ["BaseEnvironment"]


@attrs.frozen(kw_only=True)
class BaseEnvironment:
    """A process's place in the job, read once from the scheduler's variables.

    Subclasses say which variables detect them (`matches`) and how to read them
    (`from_environ`). Values are checked when the environment is made: a rank
    outside the world is an error that names the variables, never a hang later.

    Attributes:
        main_address: The host of the rendezvous.
        main_port: The port of the rendezvous.
        world_size: The number of processes in the job.
        global_rank: This process's rank among all of them.
        local_rank: Its rank on its node.
        node_rank: Its node's rank.
    """

    name: ClassVar[str]
    variables: ClassVar[Mapping[str, str]] = {}
    """For messages: the variable each field is read from."""
    detected_by: ClassVar[tuple[str, ...]] = ()
    """The variables whose presence, all together, shows this environment."""

    main_address: str
    main_port: int
    world_size: int
    global_rank: int
    local_rank: int
    node_rank: int

    @override
    def __init_subclass__(cls, **kwargs: object) -> None:
        """Let a subclass override a field with a property, as Lightning's subclasses do.

        The value the constructor is given for such a field is kept aside (the
        property answers); without this, the constructor fails setting it.
        """
        super().__init_subclass__(**kwargs)
        for field in attrs.fields(BaseEnvironment):
            found = cls.__dict__.get(field.name)
            if isinstance(found, property) and found.fset is None:
                setattr(cls, field.name, found.setter(_keeper(field.name)))

    def __attrs_post_init__(self) -> None:
        if self.world_size < 1:
            raise self._error(f"world size {self.world_size}{self._from('world_size')} is below 1")
        if not 0 <= self.global_rank < self.world_size:
            raise self._error(
                f"global rank {self.global_rank}{self._from('global_rank')} is outside the "
                f"world of {self.world_size} processes{self._from('world_size')}"
            )
        for field in ("local_rank", "node_rank"):
            if getattr(self, field) < 0:
                raise self._error(f"{field} {getattr(self, field)}{self._from(field)} is negative")
        if not 1 <= self.main_port <= 65535:
            raise self._error(f"main port {self.main_port}{self._from('main_port')} is not a port")

    @classmethod
    def matches(cls, environ: Mapping[str, str]) -> dict[str, str] | None:
        """The variables that show this environment, or ``None`` if they are absent.

        By default, every variable of `detected_by`, when all are set.
        """
        if not cls.detected_by:
            raise NotImplementedError(f"{cls.__name__} declares no detected_by variables")
        return all_present(environ, cls.detected_by)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read the environment from ``environ`` (the process's variables by default).

        Raises:
            ConfigurationError: A variable it needs is missing or malformed.
        """
        raise NotImplementedError

    def detect(self) -> bool:
        """Whether the current process's variables show this environment."""
        return self.matches(os.environ) is not None

    def set_world_size(self, size: int) -> None:
        """Lightning's setter: the world size stands as read, so ``size`` must be it.

        An environment is read once from the variables the scheduler (or plait's
        launcher) set, and is frozen: a strategy ported from Lightning that sets the
        value it reads again goes on; another value is refused rather than ignored.

        Raises:
            ConfigurationError: ``size`` is not the world size the environment holds.
        """
        self._set("world_size", size)

    def set_global_rank(self, rank: int) -> None:
        """Lightning's setter: the global rank stands as read, so ``rank`` must be it.

        Raises:
            ConfigurationError: ``rank`` is not the global rank the environment holds.
        """
        self._set("global_rank", rank)

    def _set(self, field: str, value: int) -> None:
        held = getattr(self, field)
        if value == held:
            return
        raise ConfigurationError(
            f"{self.name}: set_{field}({value!r}), and the environment holds {field}="
            f"{held}{self._from(field)}; a plait environment is read once and frozen",
            value=value,
            fix=f"make the environment with the value instead "
            f"(attrs.evolve(environment, {field}={value!r}), or {type(self).__name__}("
            f"..., {field}={value!r})), or set the variable it is read from",
        )

    def teardown(self) -> None:
        """At the end of a job, as Lightning's environments have it: nothing to undo.

        An environment here only reads the scheduler's variables; it sets none, so
        none is left behind to clear.
        """

    @property
    def creates_processes_externally(self) -> bool:
        """Whether the scheduler starts the processes (so plait only joins them)."""
        return True

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check that the scheduler launched ``num_devices`` x ``num_nodes`` processes.

        Raises:
            ConfigurationError: It launched another number, which would hang the
                rendezvous waiting for processes that never come.
        """
        expected = num_devices * num_nodes
        if self.world_size != expected:
            raise ConfigurationError(
                f"{self.name}: the scheduler launched {self.world_size} processes"
                f"{self._from('world_size')}, but devices={num_devices} x "
                f"num_nodes={num_nodes} needs {expected}",
                value=self.world_size,
                fix=f"launch {expected} processes, or set devices and num_nodes to match "
                f"the {self.world_size} launched",
            )

    def _from(self, field: str) -> str:
        variable = self.variables.get(field)
        return f" (from {variable})" if variable else ""

    def _error(self, problem: str) -> ConfigurationError:
        return ConfigurationError(
            f"{self.name}: {problem}",
            fix="check the scheduler's variables; a rank counts from 0 and stays below "
            "the world size",
        )


def _keeper(name: str) -> Callable[[BaseEnvironment, object], None]:
    """A setter that keeps the value given for ``name`` beside the property that answers."""

    def keep(environment: BaseEnvironment, value: object) -> None:
        vars(environment)[f"_given_{name}"] = value

    return keep
