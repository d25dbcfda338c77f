"""Pipeline parallelism: a module's layers split into stages over the ``pp`` ranks.

A module declares its stages by naming its submodules: either whole stages
(``stages=[["embed", "layers.0"], ["layers.1", "norm", "head"]]``) or the units in
the order its forward runs them (``units=[...]``, split evenly into as many stages
as the schedule needs). Each rank keeps a copy of the module per stage it holds,
with every submodule of the other stages replaced by ``None`` (so the module's
``forward`` skips a part that is ``None``, as torchtitan's models do): the names
of parameters are the whole model's, and a checkpoint saved per stage loads into
any other split, or into the whole model in one process.

`Pipeline` holds the rank's stages (``parts``, parallelized and sharded by the user
like any module on the mesh) and runs torch's pipeline schedules over them:
`Pipeline.step` (forward and backward over microbatches, the loss on every rank)
and `Pipeline.evaluate` (forward only).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import torch
import torch.distributed as dist
from torch import nn
from typing_extensions import override

from plait.core import ConfigurationError

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import _PipelineSchedule

__all__ = [
    "SCHEDULES",
    "Pipeline",
    "WholePipeline",
    "check_declaration",
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


class Pipeline(nn.Module):
    """This rank's stages of a module, and the schedule that runs them.

    ``parts`` holds one module per stage the rank holds (`stage_indices`), each a
    copy of the whole module with the other stages' submodules ``None``: parallelize
    and shard each as you would the whole module (``fully_shard`` on its blocks and on
    the part itself), then set the pipeline up with the strategy
    (``strategy.setup_module(pipeline)``) and make the optimizers over
    ``pipeline.parameters()``. A state dict of the pipeline, through the strategy, is
    keyed by the whole module's names.

    `step` runs the schedule's forward and backward over ``microbatches`` chunks of a
    batch (split along dimension 0) and returns the mean loss on every rank;
    `evaluate` runs the forward alone.

    Made by ``ModelParallelStrategy.pipeline``; the arguments are its.
    """

    parts: nn.ModuleList

    def __init__(
        self,
        parts: Sequence[nn.Module],
        *,
        stages: Sequence[int],
        num_stages: int,
        schedule: str,
        microbatches: int,
        loss_fn: LossFunction,
        group: dist.ProcessGroup | None,
        group_ranks: Sequence[int],
        device: torch.device,
    ) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.stages = tuple(stages)
        self.num_stages = num_stages
        self.schedule_name = schedule
        self.microbatches = microbatches
        self.loss_fn = loss_fn
        self._group = group
        self._group_ranks = tuple(group_ranks)
        self._device = device
        self._schedule: _PipelineSchedule | None = None
        self.gradient_scale = 1.0
        # What `forward`'s loss is the sum of, beside its value: its gradient, when a
        # backward pass reaches it, goes nowhere (the schedule ran the real one).
        self._ran_backward = torch.zeros((), device=device, requires_grad=True)

    @property
    def has_first_stage(self) -> bool:
        """Whether this rank runs stage 0 (the one given the inputs)."""
        return 0 in self.stages

    @property
    def has_last_stage(self) -> bool:
        """Whether this rank runs the last stage (the one given the targets)."""
        return self.num_stages - 1 in self.stages

    def whole_names(self) -> dict[str, str]:
        """Each parameter's and buffer's name here (``parts.K.``...) to its whole module's name."""
        names = {}
        for index, part in enumerate(self.parts):
            for name, _ in (*part.named_parameters(), *part.named_buffers()):
                names[f"parts.{index}.{name}"] = name
        return names

    def _built(self) -> _PipelineSchedule:
        # Built at the first step, after the parts were parallelized and set up: a
        # stage holds its module as it runs.
        if self._schedule is None:
            from torch.distributed.pipelining import PipelineStage  # noqa: PLC0415
            from torch.distributed.pipelining.schedules import (  # noqa: PLC0415
                get_schedule_class,
            )

            stages = [
                PipelineStage(part, index, self.num_stages, self._device, group=self._group)
                for part, index in zip(self.parts, self.stages, strict=True)
            ]
            for stage in stages:
                _buffers_kept_through_shape_inference(stage)
            schedule_class = get_schedule_class(self.schedule_name)
            loss_fn = self._scaled_loss
            if self.schedule_name in _SINGLE:
                self._schedule = schedule_class(
                    stages[0], self.microbatches, loss_fn=loss_fn, scale_grads=False
                )
            else:
                self._schedule = schedule_class(
                    stages, self.microbatches, loss_fn=loss_fn, scale_grads=False
                )
        return self._schedule

    @property
    def _loss_factor(self) -> float:
        # What each microbatch's loss is multiplied by before its backward: the mean
        # over microbatches, and `gradient_scale`. (torch's own ``scale_grads``
        # would divide every gradient at the end of a step, the ones accumulated
        # from earlier steps too.)
        return self.gradient_scale / self.microbatches

    def _scaled_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # What the schedule's backward starts from.
        return self.loss_fn(output, target) * self._loss_factor

    def _check_batch(self, args: Sequence[object]) -> None:
        for value in args:
            if isinstance(value, torch.Tensor) and value.shape[0] % self.microbatches:
                raise ConfigurationError(
                    f"a batch of {value.shape[0]} does not split into "
                    f"{self.microbatches} equal microbatches",
                    value=value.shape[0],
                    fix=f"use a batch size that is a multiple of {self.microbatches}, or "
                    "pipeline_microbatches that divides it",
                )

    def _run(
        self,
        method: str,
        args: tuple[torch.Tensor, ...],
        target: torch.Tensor | None,
        kwargs: Mapping[str, object],
    ) -> torch.Tensor:
        self._check_batch(args)
        if self.has_last_stage and target is None:
            raise ConfigurationError(
                "the pipeline's last stage computes the loss, and no target was given",
                fix="pass target= (the same on every rank: only the last stage reads it)",
            )
        run: Callable[..., object] = getattr(self._built(), method)
        losses: list[torch.Tensor] = []
        inputs = args if self.has_first_stage else ()
        run(
            *inputs,
            target=target if self.has_last_stage else None,
            losses=losses if self.has_last_stage else None,
            **kwargs,
        )
        # The last stage's loss, the mean over microbatches, to every rank of the group.
        if self.has_last_stage:
            loss = torch.stack([value.detach().float() for value in losses]).mean()
            loss = loss / self._loss_factor
        else:
            loss = torch.zeros((), device=self._device)
        if self._group_ranks and len(self._group_ranks) > 1:
            source = self._group_ranks[
                stage_owner(self.schedule_name, self.num_stages - 1, len(self._group_ranks))
            ]
            dist.broadcast(loss, src=source, group=self._group)
        return loss

    def _in_turn(
        self,
        args: tuple[torch.Tensor, ...],
        target: torch.Tensor | None,
        kwargs: Mapping[str, object],
    ) -> torch.Tensor:
        self._check_batch(args)
        if target is None:
            raise ConfigurationError(
                "the pipeline's last stage computes the loss, and no target was given",
                fix="pass target= (the same on every rank: only the last stage reads it)",
            )
        losses = []
        for index in range(self.microbatches):

            def chunk(value: object, index: int = index) -> object:
                if isinstance(value, torch.Tensor):
                    return value.tensor_split(self.microbatches)[index]
                return value

            outputs: tuple[object, ...] = tuple(chunk(value) for value in args)
            chunked = {name: chunk(value) for name, value in kwargs.items()}
            for part in self.parts:
                output = part(*outputs, **chunked)
                outputs = output if isinstance(output, tuple) else (output,)
            [output] = outputs
            assert isinstance(output, torch.Tensor)
            losses.append(self.loss_fn(output, target.tensor_split(self.microbatches)[index]))
        return torch.stack([loss.detach().float() for loss in losses]).mean()

    @override
    def forward(
        self, *args: torch.Tensor, target: torch.Tensor | None = None, **kwargs: object
    ) -> torch.Tensor:
        """The mean loss of the batch, on every rank: `step` in training, `evaluate` else.

        In training mode with gradients enabled the schedule runs the forward and the
        backward at once: the loss returned has already been back-propagated, and a
        backward pass from it (``loss.backward()``, the Trainer's, a strategy's)
        does nothing more. Under ``torch.no_grad`` or in ``eval()`` mode, the
        forward alone (`evaluate`).

        Under the Trainer, a step's gradients are those of the loss divided by the
        batches accumulated: the Trainer sets `gradient_scale`.
        """
        if self.training and torch.is_grad_enabled():
            loss = self.step(*args, target=target, **kwargs)
            self._ran_backward.grad = None
            return loss + self._ran_backward
        return self.evaluate(*args, target=target, **kwargs)

    def step(
        self, *args: torch.Tensor, target: torch.Tensor | None = None, **kwargs: object
    ) -> torch.Tensor:
        """Forward and backward over the batch's microbatches; the mean loss, on every rank.

        Every rank passes the same batch (``args`` go to the first stage, ``target``
        to the last, keyword tensors to every stage, each split along dimension 0);
        the gradients, scaled by the number of microbatches, are what one backward
        of the batch's mean loss gives. The optimizers' step is yours.

        Raises:
            ConfigurationError: The batch does not split into the microbatches, or
                no target reaches the last stage.
        """
        return self._run("step", args, target, kwargs)

    def evaluate(
        self, *args: torch.Tensor, target: torch.Tensor | None = None, **kwargs: object
    ) -> torch.Tensor:
        """The forward alone, over the batch's microbatches; the mean loss, on every rank.

        With every stage on this rank (``pipeline_parallel_size=1``), the parts run
        one after another on each microbatch (torch's forward-only schedule cannot
        pass activations between two stages of one rank).

        Raises:
            ConfigurationError: The schedule is V-shaped over several ranks (it has
                no forward-only path: torch's would fail on the rank that holds two
                consecutive stages and leave the others waiting), or the batch is
                refused as by `step`.
        """
        if len(self._group_ranks) <= 1:
            with torch.no_grad():
                return self._in_turn(args, target, kwargs)
        if self.schedule_name in _V_SHAPED:
            raise ConfigurationError(
                f"the {self.schedule_name} schedule cannot run forward only: its "
                "stages are built for backward, and evaluating would fail on one rank "
                "while the others wait for it",
                value=self.schedule_name,
                fix="evaluate from the trained checkpoint through a pipeline made with "
                "pipeline_schedule='1F1B' or 'Interleaved1F1B' (plait validate "
                "--pipeline-parallel-size N --pipeline-schedule 1F1B), or in one "
                "process without a pipeline; or "
                "train with 'InterleavedZeroBubble', which evaluates",
            )
        with torch.no_grad():
            return self._run("eval", args, target, kwargs)


class WholePipeline(nn.Module):
    """A module's pipeline where nothing splits it: the module whole, then the loss.

    What ``Module.pipeline`` gives under a strategy without pipeline ranks (or with
    ``pipeline_parallel_size=1``), so that one module runs everywhere: its
    parameters, buffers and submodules are the network's own, under the same names
    (a checkpoint of either loads into the other), and calling it gives the loss of
    the network's output, to back-propagate as any loss.

    Args:
        network: The module the stages would be cut from.
        loss_fn: The loss of the network's output and the target.
    """

    def __init__(self, network: nn.Module, loss_fn: LossFunction) -> None:
        super().__init__()
        # The network's own tables: the same names, and the same tensors.
        self._modules = network._modules
        self._parameters = network._parameters
        self._buffers = network._buffers
        object.__setattr__(self, "network", network)
        self.loss_fn = loss_fn
        self.gradient_scale = 1.0

    network: nn.Module

    @property
    def parts(self) -> tuple[nn.Module, ...]:
        """The one part: the network."""
        return (self.network,)

    @override
    def forward(
        self, *args: torch.Tensor, target: torch.Tensor | None = None, **kwargs: object
    ) -> torch.Tensor:
        """The loss of the network's output on ``args`` (and ``kwargs``) against ``target``."""
        if target is None:
            raise ConfigurationError(
                "a pipeline computes the loss, and no target was given",
                fix="pass target= (the same on every rank: only the last stage reads it)",
            )
        return self.loss_fn(self.network(*args, **kwargs), target)

    @override
    def train(self, mode: bool = True) -> WholePipeline:
        self.network.training = mode
        return super().train(mode)


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


def _buffers_kept_through_shape_inference(stage: object) -> None:
    """Make ``stage``'s shape inference leave its module's buffers as they were.

    At its first step a schedule learns the shapes each stage passes on by running
    every stage's module forward once, in training mode, on the first micro-batch or
    (past the first stage) on tensors made with ``torch.empty``: a batch norm would
    count that forward in its running statistics, garbage and NaN included.
    """
    infer = getattr(stage, "_forward_metadata_inference", None)
    module = getattr(stage, "submod", None)
    if not callable(infer) or not isinstance(module, nn.Module):
        return

    def kept(*args: object, **kwargs: object) -> object:
        saved = [(buffer, buffer.detach().clone()) for buffer in module.buffers()]
        try:
            return infer(*args, **kwargs)
        finally:
            # Swapped in, not copied: the shapes of the backward are learnt next,
            # through this forward's graph, which holds the buffers as they are now.
            for buffer, value in saved:
                buffer.data = value

    stage._forward_metadata_inference = kept  # type: ignore[attr-defined]
