"""Where a run spends its time: regions timed by name, reported per rank at the run's end.

The loops mark regions (``training_step``, ``backward``, ``optimizer_step``, each
hook, ...) with `Profiler.region`; a profiler does what it likes with them.
`PassThroughProfiler` (no ``profiler=`` given) does nothing, at the cost of one
shared context per region. `SimpleProfiler` times each region and writes a table,
`AdvancedProfiler` runs cProfile inside each outermost region, and
`PyTorchProfiler` records a ``torch.profiler`` trace (operators, and the regions as
``record_function`` ranges).
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pstats
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias, runtime_checkable

from typing_extensions import override

from plait.core import ConfigurationError

if TYPE_CHECKING:
    import torch

__all__ = [
    "PROFILERS",
    "AdvancedProfiler",
    "PassThroughProfiler",
    "Profiler",
    "PyTorchProfiler",
    "Regions",
    "SimpleProfiler",
    "make_profiler",
    "regions_of",
]


@runtime_checkable
class Profiler(Protocol):
    """What the trainer tells a profiler: a run's start and end, its regions and steps."""

    def start(self, stage: str, directory: str, rank: int) -> None:
        """A run of ``stage`` starts in rank ``rank``; reports go under ``directory``."""
        ...

    def region(self, name: str) -> contextlib.AbstractContextManager[None]:
        """The context the region ``name`` runs in."""
        ...

    def step(self) -> None:
        """A training batch ended."""
        ...

    def stop(self) -> str | None:
        """The run ended: write the report; the path written, if any."""
        ...


_NOTHING: Final = contextlib.nullcontext()


class PassThroughProfiler(Profiler):
    """Profiles nothing: the trainer's default."""

    @override
    def start(self, stage: str, directory: str, rank: int) -> None:
        pass

    @override
    def region(self, name: str) -> contextlib.AbstractContextManager[None]:
        return _NOTHING

    @override
    def step(self) -> None:
        pass

    @override
    def stop(self) -> str | None:
        return None


Regions: TypeAlias = Callable[[str], contextlib.AbstractContextManager[None]]
"""A profiler's ``region``: the context a named region runs in."""


def regions_of(profiler: Profiler) -> Regions | None:
    """``profiler.region``, or ``None`` where it times nothing (`PassThroughProfiler`).

    The loops' per-batch code enters a region only when this is not ``None``: a
    training step without a profiler costs no context at all.
    """
    return None if isinstance(profiler, PassThroughProfiler) else profiler.region


class _Reporting(Profiler):
    """A profiler that writes one report per run and rank."""

    kind = "profiler"

    def __init__(self) -> None:
        self._path: str | None = None

    @override
    def start(self, stage: str, directory: str, rank: int) -> None:
        self._path = os.path.join(directory, f"{stage}-rank{rank}-{self.kind}.txt")

    @override
    def step(self) -> None:
        pass

    def _write(self, text: str) -> str | None:
        path = self._path
        if path is None:
            return None
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as file:
            file.write(text)
        self._path = None
        return path


class SimpleProfiler(_Reporting):
    """Times every region; the report is a table: calls, total, mean and share per region."""

    kind = "simple"

    def __init__(self) -> None:
        super().__init__()
        self.durations: dict[str, list[float]] = defaultdict(list)
        self._started = 0.0

    @override
    def start(self, stage: str, directory: str, rank: int) -> None:
        super().start(stage, directory, rank)
        self.durations.clear()
        self._started = time.perf_counter()

    @override
    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        begun = time.perf_counter()
        try:
            yield
        finally:
            self.durations[name].append(time.perf_counter() - begun)

    def table(self) -> str:
        """The report: one row per region, the slowest first."""
        whole = max(time.perf_counter() - self._started, 1e-9)
        rows = sorted(self.durations.items(), key=lambda item: -sum(item[1]))
        width = max([len("region"), *(len(name) for name in self.durations)])
        lines = [
            f"{'region':<{width}}  {'calls':>7}  {'total s':>10}  {'mean ms':>10}  {'share':>6}"
        ]
        for name, times in rows:
            total = sum(times)
            lines.append(
                f"{name:<{width}}  {len(times):>7}  {total:>10.4f}  "
                f"{1000 * total / len(times):>10.4f}  {100 * total / whole:>5.1f}%"
            )
        lines.append(f"{'whole run':<{width}}  {'':>7}  {whole:>10.4f}")
        return "\n".join(lines) + "\n"

    @override
    def stop(self) -> str | None:
        return self._write(self.table())


class AdvancedProfiler(_Reporting):
    """cProfile inside each outermost region; the report holds each region's statistics.

    Regions inside another region are counted in it (cProfile does not nest).

    Args:
        lines: Functions listed per region, by cumulative time.
    """

    kind = "advanced"

    def __init__(self, lines: int = 20) -> None:
        super().__init__()
        self.lines = lines
        self.profiles: dict[str, cProfile.Profile] = {}
        self._depth = 0

    @override
    def start(self, stage: str, directory: str, rank: int) -> None:
        super().start(stage, directory, rank)
        self.profiles.clear()

    @override
    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        self._depth += 1
        if self._depth > 1:
            try:
                yield
            finally:
                self._depth -= 1
            return
        profile = self.profiles.setdefault(name, cProfile.Profile())
        profile.enable()
        try:
            yield
        finally:
            profile.disable()
            self._depth -= 1

    @override
    def __getstate__(self) -> dict[str, object]:
        # Travels to the ranks with the trainer: cProfile's profiles do not pickle, and
        # each run starts its own.
        return {**self.__dict__, "profiles": {}, "_depth": 0}

    @override
    def stop(self) -> str | None:
        report = io.StringIO()
        for name, profile in self.profiles.items():
            report.write(f"Profile of region {name}\n")
            stats = pstats.Stats(profile, stream=report)
            stats.strip_dirs().sort_stats("cumulative").print_stats(self.lines)
        return self._write(report.getvalue())


class PyTorchProfiler(Profiler):
    """A ``torch.profiler`` trace per rank: operators, and the regions as named ranges.

    The trace is written as ``<rank>.*.pt.trace.json`` for TensorBoard's profiler
    plugin or ``chrome://tracing``, under ``directory/<stage>``.

    Args:
        wait, warmup, active: The schedule, in training batches: skip ``wait``,
            warm up for ``warmup``, record ``active`` (once).
        record_shapes: Record the operators' input shapes.
        profile_memory: Record allocations.
    """

    kind = "pytorch"

    def __init__(
        self,
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        record_shapes: bool = False,
        profile_memory: bool = False,
    ) -> None:
        self.wait, self.warmup, self.active = wait, warmup, active
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self._profile: torch.profiler.profile | None = None
        self._directory: str | None = None

    @override
    def start(self, stage: str, directory: str, rank: int) -> None:
        import torch.profiler  # noqa: PLC0415 - only where asked for

        self._directory = os.path.join(directory, stage)
        schedule = torch.profiler.schedule(
            wait=self.wait, warmup=self.warmup, active=self.active, repeat=1
        )
        handler = torch.profiler.tensorboard_trace_handler(
            self._directory, worker_name=f"rank{rank}"
        )
        self._profile = torch.profiler.profile(
            schedule=schedule if stage == "fit" else None,
            on_trace_ready=handler,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
        )
        self._profile.start()

    @override
    def region(self, name: str) -> contextlib.AbstractContextManager[None]:
        import torch.autograd.profiler  # noqa: PLC0415 - imported by start already

        return torch.autograd.profiler.record_function(name)

    @override
    def step(self) -> None:
        if self._profile is not None:
            self._profile.step()

    @override
    def stop(self) -> str | None:
        profile, self._profile = self._profile, None
        if profile is None:
            return None
        profile.stop()
        return self._directory


PROFILERS: Final = ("simple", "advanced", "pytorch")
"""The profilers a trainer makes by name."""


def make_profiler(profiler: Profiler | str | None) -> Profiler:
    """The profiler ``profiler`` names (``None``: the pass-through one).

    Raises:
        ConfigurationError: An unknown name, or an object that is no `Profiler`.
    """
    if profiler is None:
        return PassThroughProfiler()
    if isinstance(profiler, str):
        made: dict[str, type[Profiler]] = {
            "simple": SimpleProfiler,
            "advanced": AdvancedProfiler,
            "pytorch": PyTorchProfiler,
        }
        if profiler not in made:
            raise ConfigurationError.invalid_choice("profiler", profiler, PROFILERS)
        return made[profiler]()
    if not isinstance(profiler, Profiler):
        raise ConfigurationError(
            f"profiler={profiler!r} is neither a name nor a Profiler",
            value=profiler,
            fix="pass 'simple', 'advanced', 'pytorch', or an object with start, region, "
            "step and stop",
        )
    return profiler
