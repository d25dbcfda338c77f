"""Pipeline stage planning: which schedule, how many stages, which rank holds which.

What a pipeline is decided from before anything runs: the schedule's name
(`schedule_name`) and how many stages a rank holds under it (`stages_per_rank`), the
declaration of a module's stages by name (`check_declaration`) and its split into
this rank's parts (`split_module`, `stage_module`), and where each stage lives
(`stage_indices`, `stage_owner`). Pure functions of their arguments and the module:
no process group, no schedule. `plait.strategies.pipeline` runs what they plan.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Final

import torch
from torch import nn

from plait.core import ConfigurationError

__all__ = [
    "SCHEDULES",
    "LossFunction",
    "check_declaration",
    "forward_only",
    "runs_one_stage",
    "schedule_name",
    "split_module",
    "split_units",
    "stage_indices",
    "stage_module",
    "stage_owner",
    "stages_per_rank",
]

SCHEDULES: Final = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)
"""torch's pipeline schedules, by the names `schedule_name` takes (in any case)."""

_SINGLE: Final = frozenset({"GPipe", "1F1B"})
"""Schedules of one stage per rank; the others run several (looped or V-shaped)."""

_V_SHAPED: Final = frozenset({"ZBVZeroBubble", "DualPipeV"})
"""Schedules whose two stages per rank are ``r`` and ``2 * pp - 1 - r``: they have no
forward-only path (torch's ``eval`` fails on one rank and its peer waits for it)."""

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def schedule_name(name: object) -> str:
    """The schedule ``name`` stands for (any case), as `SCHEDULES` spells it.

    Raises:
        ConfigurationError: ``name`` is not one of `SCHEDULES`.
    """
    by_key = {schedule.lower(): schedule for schedule in SCHEDULES}
    if isinstance(name, str) and name.lower() in by_key:
        return by_key[name.lower()]
    raise ConfigurationError(
        f"pipeline schedule {name!r} is not one of torch's",
        value=name,
        choices=SCHEDULES,
        fix="pass pipeline_schedule='1F1B' (one stage per rank) or 'Interleaved1F1B' (several)",
    )


def stages_per_rank(schedule: str, requested: object = None) -> int:
    """How many stages each rank holds under ``schedule``: 1, or 2 unless ``requested``.

    Raises:
        ConfigurationError: ``requested`` does not fit the schedule (not 1 for GPipe
            and 1F1B, not 2 for the V-shaped ones, below 2 for the looped ones).
    """
    if requested is None:
        return 1 if schedule in _SINGLE else 2
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ConfigurationError(
            f"pipeline_stages_per_rank={requested!r} is not a positive int",
            value=requested,
            fix="pass 2 (say), or leave it out to take the schedule's",
        )
    fits = (
        requested == 1
        if schedule in _SINGLE
        else requested == 2
        if schedule in _V_SHAPED
        else requested >= 2
    )
    if not fits:
        wanted = (
            "exactly 1"
            if schedule in _SINGLE
            else "exactly 2 (stages r and 2*pp-1-r)"
            if schedule in _V_SHAPED
            else "2 or more"
        )
        raise ConfigurationError(
            f"the {schedule} schedule runs {wanted} stages per rank, not {requested}",
            value=requested,
            fix="leave pipeline_stages_per_rank out to take the schedule's, or pick a "
            "schedule for it: GPipe or 1F1B for one stage, Interleaved1F1B for several",
        )
    return requested


def stage_indices(schedule: str, rank: int, size: int, per_rank: int) -> tuple[int, ...]:
    """The stages pipeline rank ``rank`` of ``size`` holds, in the order it runs them.

    Looped schedules give rank ``r`` stages ``r, r + size, r + 2 * size, ...``; the
    V-shaped ones ``r`` and ``2 * size - 1 - r`` (the last stage on rank 0).
    """
    if schedule in _V_SHAPED:
        return (rank, 2 * size - 1 - rank)
    return tuple(rank + k * size for k in range(per_rank))


def split_units(units: Sequence[str], stages: int) -> list[list[str]]:
    """``units`` (in forward order) in ``stages`` consecutive groups, as even as they go.

    Raises:
        ConfigurationError: Fewer units than stages.
    """
    if len(units) < stages:
        raise ConfigurationError(
            f"{len(units)} pipeline units cannot fill {stages} stages: every stage needs one",
            value=list(units),
            fix="declare finer units (each block its own), or fewer stages (a smaller "
            "pipeline_parallel_size, or a schedule of one stage per rank)",
        )
    count = len(units)
    return [list(units[k * count // stages : (k + 1) * count // stages]) for k in range(stages)]


def _check_stages(module: nn.Module, stages: Sequence[Sequence[str]]) -> None:
    # Every named unit is a submodule, none inside another, and together they hold
    # every parameter and buffer exactly once: a stage list that misses a layer
    # would train without it, silently.
    submodules = dict(module.named_modules())
    named = [name for stage in stages for name in stage]
    unknown = [name for name in named if not name or name not in submodules]
    if unknown:
        raise ConfigurationError(
            f"pipeline stages name {unknown} which are not submodules of {type(module).__name__}",
            value=unknown,
            fix="name submodules as named_modules() does ('layers.0', 'head')",
        )
    repeated = sorted({name for name in named if named.count(name) > 1})
    nested = [
        (inner, outer)
        for inner in named
        for outer in named
        if inner != outer and inner.startswith(outer + ".")
    ]
    if repeated or nested:
        twice = repeated or [f"{inner} (inside {outer})" for inner, outer in nested]
        raise ConfigurationError(
            f"pipeline stages name {twice} more than once: each part of the model "
            "belongs to one stage",
            value=twice,
            fix="name each unit once, and not a unit and one of its submodules both",
        )
    tensors = [name for name, _ in module.named_parameters()] + [
        name for name, _ in module.named_buffers()
    ]
    missed = [name for name in tensors if not any(name.startswith(unit + ".") for unit in named)]
    if missed:
        shown = ", ".join(missed[:4]) + (", ..." if len(missed) > 4 else "")
        raise ConfigurationError(
            f"pipeline stages leave out {len(missed)} of {type(module).__name__}'s "
            f"tensors ({shown}): no stage would run or train them",
            value=missed,
            fix="add the submodules that hold them to a stage (a layer left out of "
            "the list, or a parameter set directly on a module that is split)",
        )


def stage_module(module: nn.Module, drop: Sequence[str]) -> nn.Module:
    """A copy of ``module`` with the submodules named in ``drop`` replaced by ``None``.

    Names of parameters and buffers are the whole module's: the copy's state is a
    part of the whole one's.
    """
    # The dropped submodules are not copied (a stage of a large model costs its own
    # share, not the whole): the copy takes None for them, unless one is held under
    # another name too, which keeps its copy there.
    held = Counter(id(submodule) for _, submodule in module.named_modules(remove_duplicate=False))
    skipped: dict[int, object] = {}
    for name in drop:
        submodule = module.get_submodule(name)
        if held[id(submodule)] == 1:
            skipped[id(submodule)] = None
    part: nn.Module = copy.deepcopy(module, skipped)
    for name in drop:
        parent_name, _, leaf = name.rpartition(".")
        parent = part.get_submodule(parent_name) if parent_name else part
        parent.register_module(leaf, None)
    return part


def stage_owner(schedule: str, stage: int, size: int) -> int:
    """The pipeline rank that holds ``stage`` under ``schedule`` with ``size`` ranks."""
    if schedule in _V_SHAPED:
        return stage if stage < size else 2 * size - 1 - stage
    return stage % size


def check_declaration(
    module: nn.Module,
    *,
    units: Sequence[str] | None,
    stages: Sequence[Sequence[str]] | None,
) -> None:
    """Refuse a declaration of ``module``'s stages that no split could run.

    Raises:
        ConfigurationError: Neither or both of ``units`` and ``stages``; names that
            are not submodules, a name given twice (or inside another), or parts of
            the module that no name covers.
    """
    if (stages is None) == (units is None):
        raise ConfigurationError(
            "a pipeline is declared by its stages or by its units, one of the two",
            value=(stages, units),
            fix="pass units=[...] (submodules in forward order, split evenly) or "
            "stages=[[...], ...] (one list of submodules per stage)",
        )
    if units is not None:
        _check_stages(module, [[units] if isinstance(units, str) else list(units)])
    else:
        assert stages is not None
        _check_stages(module, [[s] if isinstance(s, str) else list(s) for s in stages])


def split_module(
    module: nn.Module,
    *,
    stages: Sequence[Sequence[str]] | None,
    units: Sequence[str] | None,
    schedule: str,
    per_rank: int,
    rank: int,
    size: int,
) -> tuple[list[nn.Module], tuple[int, ...], int]:
    """This rank's parts of ``module``, the stages they are, and how many stages in all.

    Raises:
        ConfigurationError: Neither or both of ``stages`` and ``units``; another number
            of stages than the schedule runs; stages that miss, repeat or do not name
            the module's parts.
    """
    num_stages = per_rank * size
    check_declaration(module, units=units, stages=stages)
    if stages is None:
        assert units is not None
        if isinstance(units, str):
            units = [units]
        stages = split_units(list(units), num_stages)
    stages = [[stage] if isinstance(stage, str) else list(stage) for stage in stages]
    if len(stages) != num_stages:
        raise ConfigurationError(
            f"{len(stages)} pipeline stages given, and {size} pipeline ranks of "
            f"{per_rank} stage(s) under {schedule} run {num_stages}",
            value=len(stages),
            fix=f"declare {num_stages} stages, or pass units=[...] to split them evenly",
        )
    mine = stage_indices(schedule, rank, size, per_rank)
    everything = [name for stage in stages for name in stage]
    parts = [
        stage_module(module, drop=[name for name in everything if name not in stages[index]])
        for index in mine
    ]
    return parts, mine, num_stages


def runs_one_stage(schedule: str) -> bool:
    """Whether ``schedule`` gives each rank one stage (GPipe, 1F1B)."""
    return schedule in _SINGLE


def forward_only(schedule: str) -> bool:
    """Whether ``schedule`` has a forward-only path (the V-shaped ones have none)."""
    return schedule not in _V_SHAPED
