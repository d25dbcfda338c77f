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
and `Pipeline.evaluate` (forward only). The planning (schedules, stages, the split)
lives in `plait.strategies.pipeline_plan`, and the module kept whole where nothing
splits it (`WholePipeline`) in `plait.strategies.whole_pipeline`; their names are
here too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from typing_extensions import override

from plait.core import ConfigurationError
from plait.strategies.pipeline_plan import (
    SCHEDULES,
    LossFunction,
    check_declaration,
    forward_only,
    runs_one_stage,
    schedule_name,
    split_module,
    split_units,
    stage_indices,
    stage_module,
    stage_owner,
    stages_per_rank,
)
from plait.strategies.whole_pipeline import WholePipeline

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import _PipelineSchedule

__all__ = [
    "SCHEDULES",
    "LossFunction",
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
            if runs_one_stage(self.schedule_name):
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
        if not forward_only(self.schedule_name):
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
