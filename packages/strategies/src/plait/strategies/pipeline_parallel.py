"""`PipelineParallel`: the part of a mesh strategy that runs a model's stages over ``pp``.

`ModelParallelStrategy` is built from it as from its checkpoints and gradient sync:
made with the strategy's pipeline settings (the schedule, microbatches and stages a
rank holds, checked then by `plait.strategies.pipeline_plan`), it reads the mesh from
its host once the host has joined its job. It splits a module into this rank's
stages (`PipelineParallel.pipeline`), scales the gradients its schedules make by the
batches a step accumulates (`PipelineParallel.accumulate`), and does what spans the
stages: whose buffers each stage's ranks take, the whole model's state and optimizer
groups gathered over ``pp``, and a gradient norm over every stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from plait.core import ConfigurationError
from plait.strategies.mesh_plan import FLATTENED_DIMENSIONS, MeshDim, check_size
from plait.strategies.pipeline_plan import schedule_name, split_module
from plait.strategies.pipeline_plan import stages_per_rank as stages_per_rank_of

if TYPE_CHECKING:
    from plait.core.typing import StateDict
    from plait.strategies.mesh_plan import MeshHost
    from plait.strategies.pipeline import LossFunction, Pipeline

__all__ = ["PipelineParallel"]


class PipelineParallel:
    """A mesh strategy's pipeline parallelism: its settings, this rank's stages, what spans them.

    Args:
        host: The strategy (its mesh, rank, device and groups).
        schedule: torch's schedule, by name in any case (`pipeline_plan.SCHEDULES`).
        microbatches: Microbatches a step is cut into; ``None``: the number of stages.
        stages_per_rank: Stages each rank holds; ``None``: the schedule's.

    Raises:
        ConfigurationError: An unknown schedule, stages per rank the schedule does
            not run, or microbatches that are not a positive int.
    """

    def __init__(
        self,
        host: MeshHost,
        schedule: str = "1F1B",
        microbatches: int | None = None,
        stages_per_rank: int | None = None,
    ) -> None:
        self._host = host
        self.schedule = schedule_name(schedule)
        self.stages_per_rank = stages_per_rank_of(self.schedule, stages_per_rank)
        if microbatches is not None:
            check_size("pipeline_microbatches", microbatches)
        self.microbatches = microbatches

    @property
    def enabled(self) -> bool:
        """Whether the mesh has more than one pipeline rank."""
        return self._host.mesh_shape.pipeline > 1

    @property
    def group(self) -> dist.ProcessGroup | None:
        """This rank's ``pp`` group (``None``: pp = 1)."""
        return self._host.mesh_group(MeshDim.PIPELINE) if self.enabled else None

    def accumulate(self, module: torch.nn.Module, batches: int) -> None:
        """Each pipeline in ``module`` divides the gradients its schedule makes by ``batches``.

        A pipeline back-propagates inside its call, before the caller could divide its
        loss by the batches accumulated into one optimizer step.
        """
        from plait.strategies.pipeline import Pipeline  # noqa: PLC0415

        if isinstance(batches, bool) or batches < 1:
            raise ConfigurationError(
                f"accumulate(batches={batches!r}): the batches of one optimizer step "
                "must be a positive int",
                value=batches,
                fix="pass the accumulate_grad_batches the loop steps with (1: none)",
            )
        for submodule in module.modules():
            if isinstance(submodule, Pipeline):
                submodule.gradient_scale = 1 / batches

    def pipeline(
        self,
        module: torch.nn.Module,
        loss_fn: LossFunction,
        *,
        units: Sequence[str] | None = None,
        stages: Sequence[Sequence[str]] | None = None,
        schedule: str | None = None,
        microbatches: int | None = None,
        stages_per_rank: int | None = None,
    ) -> Pipeline:
        """This rank's stages of ``module``, and the schedule to run them: a `Pipeline`.

        Raises:
            ConfigurationError: The stages do not fit the schedule or the module, or
                an unknown schedule.
        """
        from plait.strategies.pipeline import Pipeline  # noqa: PLC0415

        name = schedule_name(schedule) if schedule is not None else self.schedule
        per_rank = (
            self.stages_per_rank
            if schedule is None and stages_per_rank is None
            else stages_per_rank_of(name, stages_per_rank)
        )
        host = self._host
        shape = host.mesh_shape
        parts, mine, count = split_module(
            module,
            stages=stages,
            units=units,
            schedule=name,
            per_rank=per_rank,
            rank=shape.coordinates(host.global_rank)[MeshDim.PIPELINE],
            size=shape.pipeline,
        )
        chunks = microbatches if microbatches is not None else self.microbatches
        if chunks is not None:
            check_size("microbatches", chunks)
        return Pipeline(
            parts,
            stages=mine,
            num_stages=count,
            schedule=name,
            microbatches=chunks if chunks is not None else count,
            loss_fn=loss_fn,
            group=self.group,
            group_ranks=shape.line([MeshDim.PIPELINE], host.global_rank),
            device=host.root_device,
        )

    def buffer_sources(self) -> list[tuple[dist.ProcessGroup | None, int]]:
        """Each stage's first rank's buffers, within the stage: along ``dp``, ``cp``, ``tp``.

        A stage's ranks hold its buffers, which another stage's do not: they are sent
        along each of those dimensions in turn from the rank whose coordinate there
        is 0.
        """
        host = self._host
        sources: list[tuple[dist.ProcessGroup | None, int]] = []
        for name in (MeshDim.DATA, MeshDim.CONTEXT, MeshDim.TENSOR):
            line = host.mesh_shape.line(FLATTENED_DIMENSIONS.get(name, (name,)), host.global_rank)
            if len(line) > 1:
                sources.append((host.mesh_group(name), line[0]))
        return sources

    def whole_state(self, stage_state: StateDict) -> StateDict:
        """Every stage's whole state on rank 0's CPU (empty elsewhere), by the model's names.

        ``stage_state`` is this rank's stages' state, gathered whole within the stage;
        one rank of each stage sends it over ``pp``.
        """
        host = self._host
        where = host.mesh_shape.coordinates(host.global_rank)
        first = all(where[name] == 0 for name in (MeshDim.DATA, MeshDim.CONTEXT, MeshDim.TENSOR))
        mine = (
            {
                name: value.detach().cpu() if isinstance(value, torch.Tensor) else value
                for name, value in stage_state.items()
            }
            if first
            else {}
        )
        stages: list[StateDict | None] = [None] * host.mesh_shape.pipeline
        dist.all_gather_object(stages, mine, group=self.group)
        if host.global_rank != 0:
            return {}
        whole: dict[str, object] = {}
        for part in stages:
            whole.update(part or {})
        return whole

    def whole_param_groups(self, state: StateDict) -> StateDict:
        """An optimizer's state whose groups list every stage's parameters, by name.

        Each rank holds its stages' parameters: the names its groups list are
        gathered over ``pp``, so that a checkpoint's groups are the whole model's.
        """
        groups = state.get("param_groups")
        assert isinstance(groups, list)
        mine = [list(entry["params"]) for entry in groups]
        everyone: list[list[list[str]] | None] = [None] * self._host.mesh_shape.pipeline
        dist.all_gather_object(everyone, mine, group=self.group)
        return {
            **state,
            "param_groups": [
                {**entry, "params": list(dict.fromkeys(
                    name for ranks in everyone if ranks is not None for name in ranks[index]
                ))}
                for index, entry in enumerate(groups)
            ],
        }  # fmt: skip

    def clip_norm(self, optimizer: torch.optim.Optimizer, clip_val: float) -> torch.Tensor:
        """Clip ``optimizer``'s gradients by the norm over every stage's; that norm.

        The squared norms of this rank's stages' gradients are summed over ``pp``.
        """
        parameters = [
            parameter
            for group in optimizer.param_groups
            for parameter in group["params"]
            if parameter.grad is not None
        ]
        norms = [_whole_norm(torch.linalg.vector_norm(p.grad)) for p in parameters]
        squared = (
            torch.stack(norms).square().sum()
            if norms
            else torch.zeros((), device=self._host.root_device)
        )
        dist.all_reduce(squared, group=self.group)
        total = squared.sqrt()
        torch.nn.utils.clip_grads_with_norm_(parameters, clip_val, total)
        return total


def _whole_norm(norm: torch.Tensor) -> torch.Tensor:
    # A DTensor gradient's norm is a DTensor (partial or replicated): its whole value.
    full = getattr(norm, "full_tensor", None)
    value: torch.Tensor = full() if callable(full) else norm
    return value
