"""The errors plait raises, all under one base, `PlaitError`.

Every error carries structured fields (ranks, the collective, what was expected and
what came) beside its readable message, so that callers can act on them without
parsing text. Errors survive pickling with their fields intact, because they are
raised in worker processes and re-raised in the launcher.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from typing_extensions import Self, override

if TYPE_CHECKING:
    from plait.core.fingerprint import CollectiveCall

__all__ = [
    "CheckpointError",
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "ConfigurationError",
    "MissingDependencyError",
    "PeerFailedError",
    "PlaitError",
    "suggest",
]

_TRACEBACK_TAIL_LINES: Final = 20
_EXCEPTION_LINE: Final = re.compile(
    r"^(?:\[rank\d+\]: )?[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Stopped)(?::|$)"
)


def _edits(a: str, b: str) -> int:
    """The typing mistakes between ``a`` and ``b`` (optimal string alignment distance).

    Insertions, deletions, substitutions and swaps of neighbours count one each.
    """
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, left in enumerate(a, start=1):
        current = [i] + [0] * len(b)
        for j, right in enumerate(b, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (left != right))
            if i > 1 and j > 1 and left == b[j - 2] and a[i - 2] == right:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]


def suggest(value: object, choices: Iterable[str]) -> str | None:
    """Return the choice closest to ``value``, or ``None`` when nothing is close.

    Args:
        value: What the user wrote. Non-strings never match.
        choices: The valid spellings.

    Returns:
        Among the choices `difflib.get_close_matches` finds close (compared
        case-insensitively), the one fewest typing mistakes away, then the one of the
        same length (``"dpp"`` is ``"ddp"`` mistyped rather than ``"dp"``), in the
        spelling of ``choices``.
    """
    if not isinstance(value, str):
        return None
    import difflib  # noqa: PLC0415 (only a mistake needs it; keep importing plait.core fast)

    typed = value.strip().lower()
    by_lower = {choice.lower(): choice for choice in choices}
    matches = difflib.get_close_matches(typed, list(by_lower), n=5, cutoff=0.6)
    if not matches:
        return None
    best = min(
        matches,
        key=lambda match: (
            _edits(typed, match),
            abs(len(match) - len(typed)),
            -difflib.SequenceMatcher(None, typed, match).ratio(),
        ),
    )
    return by_lower[best]


def _restore(
    cls: type[PlaitError], args: tuple[object, ...], state: dict[str, object]
) -> PlaitError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class PlaitError(Exception):
    """Base class of every error plait raises."""

    @override
    def __reduce__(self) -> tuple[object, ...]:
        # Subclasses take keyword-only fields that Exception's default pickling would
        # drop; rebuilding from the instance dictionary keeps all of them.
        return (_restore, (type(self), self.args, dict(self.__dict__)))


class ConfigurationError(PlaitError, ValueError):
    """A setting is invalid: raised before any process starts or any work is done.

    Attributes:
        value: The offending value, when there is one.
        choices: The valid choices, when the setting has a closed set of them.
        suggestion: The valid choice closest to ``value`` ("did you mean").
        fix: A sentence telling the user what to write instead.
    """

    value: object
    choices: tuple[str, ...]
    suggestion: str | None
    fix: str | None

    def __init__(
        self,
        message: str,
        *,
        value: object = None,
        choices: Sequence[str] = (),
        suggestion: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.value = value
        self.choices = tuple(choices)
        self.suggestion = suggestion
        self.fix = fix
        parts = [message]
        if self.choices:
            parts.append(f"valid choices: {', '.join(repr(c) for c in self.choices)}")
        if suggestion is not None:
            parts.append(f"did you mean {suggestion!r}?")
        if fix is not None:
            parts.append(f"fix: {fix}")
        super().__init__("\n  ".join(parts))

    @classmethod
    def invalid_choice(
        cls,
        what: str,
        value: object,
        choices: Sequence[str],
        *,
        fix: str | None = None,
    ) -> Self:
        """Build the error for a value outside a closed set of choices.

        Args:
            what: What the value is for, e.g. ``"reduce_op"`` or ``"strategy"``.
            value: The value given.
            choices: Every valid choice, in the order to show them.
            fix: What to write instead; the closest choice is suggested on its own.
        """
        return cls(
            f"invalid {what}: {value!r}",
            value=value,
            choices=choices,
            suggestion=suggest(value, choices),
            fix=fix,
        )


class MissingDependencyError(PlaitError, ImportError):
    """An optional package that a feature needs is not installed.

    Attributes:
        feature: What needed the package, e.g. ``"the 'deepspeed' strategy"``.
        install: The requirement to install, e.g. ``"plait-strategies[deepspeed]"``.
        module: The module that failed to import, when one did.
    """

    feature: str
    install: str
    module: str | None

    def __init__(self, *, feature: str, install: str, module: str | None = None) -> None:
        self.feature = feature
        self.install = install
        self.module = module
        needed = install if module is None else f"the module {module!r}"
        super().__init__(
            f"{feature} needs {needed}, which is not installed\n  fix: pip install '{install}'"
        )


class CheckpointError(PlaitError):
    """A checkpoint cannot be written, read or removed.

    Attributes:
        path: The checkpoint's path or URL.
        reason: What is wrong with it.
        fix: What the user can do about it, when something can be done.
    """

    path: str
    reason: str
    fix: str | None

    def __init__(self, path: str, reason: str, *, fix: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.fix = fix
        message = f"checkpoint {path!r}: {reason}"
        if fix is not None:
            message += f"\n  fix: {fix}"
        super().__init__(message)


class CollectiveError(PlaitError):
    """Base class of the errors a collective raises on every rank."""


def _ranks(ranks: Iterable[int]) -> str:
    return ", ".join(str(rank) for rank in sorted(ranks))


class CollectiveMismatchError(CollectiveError):
    """Ranks called collectives that do not match, so none of them can complete.

    Raised on every rank instead of hanging or returning garbage.

    Attributes:
        calls: What each rank called, by global rank.
        expected: The call most ranks made (ties go to the call of the lowest rank).
        disagreeing_ranks: The ranks whose call differs from ``expected``, sorted.
    """

    calls: Mapping[int, CollectiveCall]
    expected: CollectiveCall
    disagreeing_ranks: tuple[int, ...]

    def __init__(self, calls: Mapping[int, CollectiveCall]) -> None:
        if not calls:
            raise ValueError("CollectiveMismatchError needs the call of at least one rank")
        self.calls = dict(sorted(calls.items()))
        groups: dict[CollectiveCall, list[int]] = {}
        for rank, call in self.calls.items():
            groups.setdefault(call, []).append(rank)
        # Most ranks first; on a tie, the group holding the lowest rank.
        ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
        self.expected = ordered[0][0]
        self.disagreeing_ranks = tuple(sorted(rank for _, ranks in ordered[1:] for rank in ranks))
        lines = [f"ranks {_ranks(self.disagreeing_ranks)} called a different collective:"]
        lines += [f"ranks {_ranks(ranks)} called {call.describe()}" for call, ranks in ordered]
        lines.append(
            "fix: every rank must call the same collectives in the same order with the "
            "same op, shape and dtype; look for a collective inside a branch that "
            "depends on the rank or on rank-local data"
        )
        super().__init__("\n  ".join(lines))


class CollectiveTimeoutError(CollectiveError):
    """A rank waited longer than its timeout for the others to reach a collective.

    Attributes:
        collective: The collective that timed out, e.g. ``"barrier"``.
        name: The name the caller gave it, if any.
        timeout: The timeout in seconds.
        missing_ranks: The ranks that had not arrived when the timeout expired.
        arrived_ranks: The ranks that had arrived.
    """

    collective: str
    name: str | None
    timeout: float
    missing_ranks: tuple[int, ...]
    arrived_ranks: tuple[int, ...]

    def __init__(
        self,
        collective: str,
        *,
        timeout: float,
        missing_ranks: Iterable[int],
        arrived_ranks: Iterable[int] = (),
        name: str | None = None,
    ) -> None:
        self.collective = collective
        self.name = name
        self.timeout = timeout
        self.missing_ranks = tuple(sorted(missing_ranks))
        self.arrived_ranks = tuple(sorted(arrived_ranks))
        label = collective if name is None else f"{collective} {name!r}"
        message = (
            f"{label} timed out after {timeout:g} s: "
            f"ranks {_ranks(self.missing_ranks)} did not arrive"
        )
        if self.arrived_ranks:
            message += f" (arrived: {_ranks(self.arrived_ranks)})"
        super().__init__(message)


class PeerFailedError(CollectiveError):
    """Another rank died or stalled; raised on every surviving rank instead of hanging.

    The first line says which rank, how it ended and why (the last line of its
    error); its traceback follows, so the error's own text comes last.

    Attributes:
        rank: The global rank of the process that failed.
        exit_code: Its exit code; negative when a signal ended it (``-9`` is SIGKILL),
            ``None`` when it is not known.
        traceback_tail: The last lines of its traceback or error output, if any.
        waited_by: For a rank that stalled: the ranks that timed out waiting for it.
        stalled_for: For a rank that stalled: how long they waited, in seconds.
    """

    rank: int
    exit_code: int | None
    traceback_tail: str
    waited_by: tuple[int, ...]
    stalled_for: float | None

    def __init__(
        self,
        rank: int,
        exit_code: int | None,
        traceback_tail: str = "",
        *,
        waited_by: Iterable[int] = (),
        stalled_for: float | None = None,
    ) -> None:
        self.rank = rank
        self.exit_code = exit_code
        lines = traceback_tail.rstrip().splitlines()[-_TRACEBACK_TAIL_LINES:]
        self.traceback_tail = "\n".join(lines)
        self.waited_by = tuple(sorted(waited_by))
        self.stalled_for = stalled_for
        cause = self.cause
        if stalled_for is not None:
            waiters = f"rank {_ranks(self.waited_by)}" if self.waited_by else "another rank"
            message = (
                f"rank {rank} stalled: {waiters} timed out after {stalled_for:g} s waiting "
                "for it in a collective, and it did not stop by itself; it was stopped"
            )
            if exit_code is not None:
                message += f" ({self.describe_exit(exit_code)})"
        else:
            message = f"rank {rank} failed ({self.describe_exit(exit_code)})"
            if cause:
                message += f": {cause}"
        if self.traceback_tail:
            plain = stalled_for is None and cause is None
            message += (":\n" if plain else "\n") + self.traceback_tail
        super().__init__(message)

    @property
    def cause(self) -> str | None:
        """The failed rank's error as its last line reads, e.g. ``RuntimeError: boom``."""
        for line in reversed(self.traceback_tail.splitlines()):
            text = line.strip()
            if _EXCEPTION_LINE.match(text):
                return text
        return None

    @staticmethod
    def describe_exit(exit_code: int | None) -> str:
        """Describe an exit code as a person reads it, naming the signal if any."""
        if exit_code is None:
            return "exit code unknown"
        if exit_code < 0:
            try:
                name = signal.Signals(-exit_code).name
            except ValueError:
                name = f"signal {-exit_code}"
            return f"exit code {exit_code}, killed by {name}"
        return f"exit code {exit_code}"
