"""The ``--plait-*`` options: added to pytest, read and checked once when it configures.

`Options.read` turns them into one typed value the plugin keeps on the pytest
config (`options_of`); a bad value is a usage error before any test runs.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Final

import attrs
import pytest

from plait.conformance.lanes import LANES

__all__ = [
    "PROFILES",
    "SEED_VARIABLE",
    "TRAINING_PROFILES",
    "Expectation",
    "Options",
    "add_options",
    "keep",
    "options_of",
    "parse_meshes",
    "parse_world_sizes",
    "read_expectations",
]

PROFILES: Final = {"quick": 25, "thorough": 200}
"""Examples per property of each ``--plait-profile``."""

TRAINING_PROFILES: Final = {"quick": 6, "thorough": 30}
"""Drawn runs per training property of each ``--plait-profile`` (each run trains a few
times: a hundred collectives, not one)."""

SEED_VARIABLE: Final = "PLAIT_CONFORMANCE_SEED"
"""Where a run's seed is kept, so that pytest-xdist's workers draw from the same one."""


def _whole(least: int) -> Callable[[str], int]:
    """An option's parser: a whole number of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} must be {least} or more")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def add_options(parser: pytest.Parser) -> None:
    """Add the ``--plait-*`` options to ``parser``."""
    group = parser.getgroup("plait", "plait conformance suite")
    group.addoption(
        "--plait-strategy", action="append", default=[], metavar="SPEC",
        help="strategy for the suite: a registered name ('ddp'), 'package.module:factory' "
        "or 'path/file.py:factory'; repeat for several",
    )  # fmt: skip
    group.addoption(
        "--plait-backend", choices=tuple(LANES), default=None,
        help="lane: gloo (CPU), gloo-cuda (gloo with CUDA tensors, ranks sharing GPUs), "
        "nccl (CUDA) or xla; default: each suite's own (gloo)",
    )  # fmt: skip
    group.addoption(
        "--plait-world-sizes", default=None, metavar="N,N,...",
        help="numbers of ranks to test at, e.g. 1,2,3,4 (keep one that is not a power of "
        "two: 3 breaks what halves the ranks); default: each suite's own (1,2,3)",
    )  # fmt: skip
    group.addoption(
        "--plait-meshes", default=None, metavar="N:AxB,...",
        help="mesh lanes: at world size N, the strategy built on each mesh shape (its "
        "factory takes mesh_shape), every property over the job and over each dimension, "
        "e.g. 4:2x2,4:1x4,2:2x1; default: each suite's own (meshes)",
    )  # fmt: skip
    group.addoption(
        "--plait-profile", choices=tuple(PROFILES), default="quick",
        help="drawn examples per property, after the grid: quick (25) or thorough (200); "
        "runs per training property: quick (6) or thorough (30)",
    )  # fmt: skip
    group.addoption(
        "--plait-examples", type=_whole(1), default=None, metavar="N",
        help="drawn examples per property, overriding the profile",
    )  # fmt: skip
    group.addoption(
        "--plait-seed", type=_whole(0), default=None, metavar="N",
        help="draw the examples from seed N (default: a new seed each run, printed in "
        "the header and on every failure)",
    )  # fmt: skip
    group.addoption(
        "--plait-deadline", type=_seconds, default=None, metavar="SECONDS",
        help="seconds an example may take before it counts as a hang (default 30)",
    )  # fmt: skip
    group.addoption(
        "--plait-start-timeout", type=_seconds, default=None, metavar="SECONDS",
        help="seconds the ranks may take to build the strategy and join (default 120)",
    )  # fmt: skip
    group.addoption(
        "--plait-require-lanes", action="store_true", default=False,
        help="fail, instead of skipping, when a lane cannot run on this machine "
        "(no GPU for nccl, no torch_xla for xla): for CI jobs on accelerators",
    )  # fmt: skip
    group.addoption(
        "--plait-report-dir", default=None, metavar="DIR",
        help="write a JSON report per strategy x backend x world size into DIR",
    )  # fmt: skip
    group.addoption(
        "--plait-expectations", default=None, metavar="FILE",
        help="known failures: lines of 'PATTERN  # reason', PATTERN matching "
        "'property[strategy-backend-world_size]'",
    )  # fmt: skip
    parser.addini(
        "plait_preload", type="linelist", default=[],
        help="modules the ranks' fork server imports once per test process, before its "
        "first rank (what your strategy's ranks import lazily): see plait.conformance.preload",
    )  # fmt: skip


def parse_world_sizes(text: str) -> tuple[int, ...]:
    """``--plait-world-sizes``: distinct positive sizes, in the order given."""
    parts = [part.strip() for part in text.split(",")]
    sizes: tuple[int, ...] = ()
    if all(part.isdigit() for part in parts):
        sizes = tuple(int(part) for part in parts)
    if not sizes or any(size < 1 for size in sizes):
        raise pytest.UsageError(
            f"--plait-world-sizes={text!r} must list positive numbers of ranks, separated "
            "by commas, e.g. 1,2,3,4"
        )
    return tuple(dict.fromkeys(sizes))


def parse_meshes(text: str) -> dict[int, tuple[tuple[int, ...], ...]]:
    """``--plait-meshes``: per world size, the mesh shapes holding its ranks."""
    found: dict[int, tuple[tuple[int, ...], ...]] = {}
    for part in (part.strip() for part in text.split(",")):
        size, colon, shape = part.partition(":")
        sizes = shape.split("x")
        if not (colon and size.isdigit() and all(each.isdigit() for each in sizes)):
            raise pytest.UsageError(
                f"--plait-meshes={text!r}: {part!r} is not WORLD_SIZE:AxB; write e.g. "
                "4:2x2,4:1x4,2:2x1"
            )
        mesh = tuple(int(each) for each in sizes)
        if math.prod(mesh) != int(size) or 0 in mesh:
            raise pytest.UsageError(
                f"--plait-meshes={text!r}: the mesh {shape} holds {math.prod(mesh)} ranks, "
                f"not {size}"
            )
        found[int(size)] = (*found.get(int(size), ()), mesh)
    return found


@attrs.frozen
class Expectation:
    """One entry of an expectations file: a pattern of tests known to fail, and why."""

    pattern: str
    reason: str
    line: int

    def matches(self, *names: str) -> bool:
        """Whether the pattern (``*`` and ``?`` wildcards, brackets literal) matches a name."""
        escaped = self.pattern.replace("[", "\0").replace("]", "[]]").replace("\0", "[[]")
        return any(fnmatch.fnmatchcase(name, escaped) for name in names)

    def lane_part(self) -> str | None:
        """The part in brackets, ``strategy-backend-world_size``, if the pattern has one."""
        _, bracket, rest = self.pattern.partition("[")
        return rest.removesuffix("]") if bracket and rest.endswith("]") else None


def read_expectations(path: str) -> list[Expectation]:
    """The entries of the expectations file at ``path`` (each must give a reason)."""
    file = Path(path)
    if not file.is_file():
        raise pytest.UsageError(f"--plait-expectations={path!r}: no such file")
    entries = []
    for number, raw in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        pattern, _, reason = text.partition("#")
        if not reason.strip():
            raise pytest.UsageError(
                f"{path}:{number}: {pattern.strip()!r} gives no reason; write "
                f"'PATTERN  # why it fails'"
            )
        entries.append(Expectation(pattern.strip(), reason.strip(), number))
    return entries


def _choose_seed(config: pytest.Config) -> int:
    """``--plait-seed``, else the xdist controller's, else ``--hypothesis-seed``, else new."""
    given: int | None = config.getoption("--plait-seed")
    if given is not None:
        return given
    inherited = os.environ.get(SEED_VARIABLE, "")
    if inherited.isdigit():  # a pytest-xdist worker: the controller's seed
        return int(inherited)
    hypothesis_seed = config.getoption("--hypothesis-seed", default=None)
    if isinstance(hypothesis_seed, int) or (
        isinstance(hypothesis_seed, str) and hypothesis_seed.isdigit()
    ):
        return int(hypothesis_seed)
    return random.SystemRandom().randrange(2**32)


@attrs.frozen
class Options:
    """The ``--plait-*`` options of a run, read and checked once.

    ``None`` (and empty) values leave each suite's own setting in place.

    Attributes:
        strategies: ``--plait-strategy``: what to test, for a suite that names none.
        backend: ``--plait-backend``.
        world_sizes: ``--plait-world-sizes``.
        meshes: ``--plait-meshes``: per world size, the mesh shapes.
        profile: ``--plait-profile``.
        examples: ``--plait-examples``: drawn examples per property.
        seed: The seed every property of the run draws from.
        deadline: ``--plait-deadline``, in seconds.
        start_timeout: ``--plait-start-timeout``, in seconds.
        require_lanes: ``--plait-require-lanes``.
        report_dir: ``--plait-report-dir``.
        expectations: The entries of ``--plait-expectations``.
        xdist: Whether pytest-xdist is loaded (each lane then runs on one worker).
    """

    strategies: tuple[str, ...]
    backend: str | None
    world_sizes: tuple[int, ...] | None
    meshes: dict[int, tuple[tuple[int, ...], ...]] | None
    profile: str
    examples: int | None
    seed: int
    deadline: float | None
    start_timeout: float | None
    require_lanes: bool
    report_dir: str | None
    expectations: tuple[Expectation, ...]
    xdist: bool

    @classmethod
    def read(cls, config: pytest.Config) -> Options:
        """The run's options, as ``config`` holds them.

        Raises:
            pytest.UsageError: A world size, mesh or expectations file is malformed.
        """
        sizes = config.getoption("--plait-world-sizes")
        meshes = config.getoption("--plait-meshes")
        expectations = config.getoption("--plait-expectations")
        return cls(
            strategies=tuple(config.getoption("--plait-strategy")),
            backend=config.getoption("--plait-backend"),
            world_sizes=parse_world_sizes(sizes) if sizes else None,
            meshes=parse_meshes(meshes) if meshes else None,
            profile=config.getoption("--plait-profile"),
            examples=config.getoption("--plait-examples"),
            seed=_choose_seed(config),
            deadline=config.getoption("--plait-deadline"),
            start_timeout=config.getoption("--plait-start-timeout"),
            require_lanes=bool(config.getoption("--plait-require-lanes")),
            report_dir=config.getoption("--plait-report-dir"),
            expectations=tuple(read_expectations(expectations) if expectations else ()),
            xdist=config.pluginmanager.hasplugin("xdist"),
        )

    @property
    def drawn_examples(self) -> int:
        """Drawn examples per property: ``--plait-examples``, or the profile's number."""
        return self.examples or PROFILES[self.profile]

    @property
    def training_examples(self) -> int:
        """Drawn runs per training property: ``--plait-examples``, or the profile's."""
        return self.examples or TRAINING_PROFILES[self.profile]


_options_key: Final = pytest.StashKey[Options]()


def options_of(config: pytest.Config) -> Options:
    """The options the plugin read when pytest configured (`Options.read`)."""
    return config.stash[_options_key]


def keep(config: pytest.Config, options: Options) -> None:
    """Keep ``options`` on ``config`` for `options_of`."""
    config.stash[_options_key] = options
