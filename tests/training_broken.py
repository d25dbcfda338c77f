"""Strategies that each break what they declare about training, on purpose.

The training kit must catch every one of them in every run (its grid runs first,
whatever the seed), naming the property broken (``test_training_kit.py``). Each is
DDP, the local SGD strategy of ``examples/local_sgd.py``, or `ModelParallelStrategy`
(whose module parallelizes itself), with one decision changed the way a real
implementation might get it wrong; every one of them keeps the collective contract.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.core import ConfigurationError, ProcessLayout, Stateful, TrainingSemantics
from plait.strategies import DDPStrategy, ModelParallelStrategy
from plait.strategies.context_parallel import context_parallel_attention
from plait.strategies.ddp import NamingDistributedDataParallel

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.distributed.device_mesh import DeviceMesh

    from plait.core.typing import Checkpoint, PathLike, StateDict
    from plait.strategies.pipeline import Pipeline

_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "local_sgd.py"


def _load_local_sgd() -> ModuleType:
    # The example is a script, not an installed module: loaded from its file, once.
    module = sys.modules.get("plait_example_local_sgd")
    if module is None:
        spec = importlib.util.spec_from_file_location("plait_example_local_sgd", _EXAMPLE)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["plait_example_local_sgd"] = module
        spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from examples.local_sgd import LocalSGDStrategy
else:
    LocalSGDStrategy = _load_local_sgd().LocalSGDStrategy


class _Unwrapped(DDPStrategy):
    """DDP without its wrapper: gradients are this class's to average (or not)."""

    steps = 0

    @override
    def configure_ddp(self, module: torch.nn.Module) -> torch.nn.Module:
        self._parameters = list(module.parameters())
        return module

    def average_gradients(self, group: dist.ProcessGroup | None = None) -> None:
        """Average every gradient over ``group`` (the job's by default)."""
        size = dist.get_world_size(group) if group is not None else self.world_size
        for parameter in self._parameters:
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad, group=group or self.process_group)
                parameter.grad /= size

    @override
    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], object] | None = None
    ) -> object:
        self.synchronise()
        self.steps += 1
        return super().optimizer_step(optimizer, closure)

    def synchronise(self) -> None:
        """Before each step: nothing here."""


class NeverSynchronises(_Unwrapped):
    """Each rank steps on its own gradients, and declares synchronous replicas."""


class SynchronisesEveryOtherStep(_Unwrapped):
    """Averages the gradients of every other step only."""

    @override
    def synchronise(self) -> None:
        if self.steps % 2 == 0:
            self.average_gradients()


class AveragesOverTheWrongGroup(_Unwrapped):
    """Averages over the first half of the ranks (the last rank keeps its own)."""

    _group: dist.ProcessGroup | None = None

    @override
    def synchronise(self) -> None:
        if self.world_size == 1:
            return
        if self._group is None:
            # Every rank makes every group, in the same order.
            self._group = dist.new_group(list(range(max(1, self.world_size // 2))))
        if self.global_rank < max(1, self.world_size // 2):
            self.average_gradients(self._group)


class StopsBroadcastingBuffers(DDPStrategy):
    """Wraps the module with ``broadcast_buffers=False``, and declares what DDP does."""

    @override
    def configure_ddp(self, module: torch.nn.Module) -> torch.nn.Module:
        return NamingDistributedDataParallel(
            module, process_group=self.process_group, broadcast_buffers=False
        )


class DropsOptimizerState(DDPStrategy):
    """Saves the optimizer's parameter groups and leaves its state (momentum, moments) out."""

    @override
    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> StateDict:
        return {"state": {}, "param_groups": optimizer.state_dict()["param_groups"]}


def _strings(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(key): _strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_strings(item) for item in value]
    return value


class TurnsKeysIntoStrings(DDPStrategy):
    """Saves each `Stateful` object's state with its keys made strings, as a flat format would."""

    @override
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        flattened = {
            name: _strings(value.state_dict())
            if isinstance(value, Stateful)
            and not isinstance(value, torch.nn.Module | torch.optim.Optimizer)
            else value
            for name, value in checkpoint.items()
        }
        super().save_checkpoint(flattened, path)


class StepsSchedulersAgainOnLoad(DDPStrategy):
    """ "Catches up" each scheduler it restores by one step."""

    @override
    def load_checkpoint(
        self,
        path: PathLike,
        state: torch.nn.Module | Mapping[str, object] | None = None,
        *,
        weights_only: bool = False,
        strict: bool = True,
    ) -> Checkpoint:
        rest = super().load_checkpoint(path, state, weights_only=weights_only, strict=strict)
        if isinstance(state, Mapping):
            for value in state.values():
                if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
                    value.step()
        return rest


class KeepsRankZerosReplica(LocalSGDStrategy):
    """Local SGD whose checkpoint holds rank 0's replica alone (DDP's state, unchanged)."""

    @override
    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        return DDPStrategy.get_state_dict(self, module, optimizers)

    @override
    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        DDPStrategy.set_state_dict(self, module, optimizers, state, source=source)


class RefusesEverything(DDPStrategy):
    """Refuses every module with a ConfigurationError: it proves nothing."""

    @override
    def setup_module_and_optimizers(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> tuple[torch.nn.Module, list[torch.optim.Optimizer]]:
        raise ConfigurationError(
            "RefusesEverything takes no module", value=module, fix="use another strategy"
        )


class DiLoCo(LocalSGDStrategy):
    """The guide's strategy as DiLoCo: every 4 steps an outer Nesterov SGD step (correct).

    Each broken copy below starts from it and changes one decision.
    """

    def __init__(
        self,
        *,
        sync_every: int = 4,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        nesterov: bool = True,
        fragments: int = 1,
        periods: Sequence[int] = (),
        precision: str | None = None,
        checkpoint_io: str | None = None,
    ) -> None:
        super().__init__(
            sync_every=sync_every,
            outer_lr=outer_lr,
            outer_momentum=outer_momentum,
            nesterov=nesterov,
            fragments=fragments,
            periods=periods,
            precision=precision,
            checkpoint_io=checkpoint_io,
        )


class DiLoCoNeverMeets(DiLoCo):
    """Its replicas never meet: neither every 4 steps nor at the end."""

    @override
    def meet(self, fragments: Collection[int] | None = None) -> None:
        pass


class DiLoCoMeetsEveryOtherPeriod(DiLoCo):
    """Meets every 8 steps (a counter compared with twice the period) and at the end."""

    @override
    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: object | None = None
    ) -> object:
        result = DDPStrategy.optimizer_step(self, optimizer, closure)  # type: ignore[arg-type]
        self.steps += 1
        if self.steps % (2 * self.sync_every) == 0:
            self.meet()
        return result

    @override
    def on_train_end(self) -> None:
        if self.steps % (2 * self.sync_every):
            self.meet()


class DiLoCoOuterStepUp(DiLoCo):
    """Takes the outer step the wrong way: ``anchor + lr * update``."""

    @override
    def meet(self, fragments: Collection[int] | None = None) -> None:
        averaging = self.averaging
        indices = self._indices(fragments)
        with torch.no_grad():
            for index, mean in zip(indices, self._mean(indices), strict=True):
                anchor = self._anchor[index]
                update = anchor - mean
                buffer = self._momentum[index] * averaging.outer_momentum + update
                self._momentum[index] = buffer
                update = update + averaging.outer_momentum * buffer
                anchor.add_(averaging.outer_lr * update)  # the flaw: add, not subtract
                self._parameters[index].copy_(anchor)


class DiLoCoForgetsOuterMomentumOnSave(DiLoCo):
    """Saves everything of its own but the outer momentum (a resume starts it afresh)."""

    @override
    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        state = super().get_state_dict(module, optimizers)
        own = state["local_sgd"]
        assert isinstance(own, dict)
        own["momentum"] = []
        return state


class DiLoCoKeepsItsMomentumOnLoad(DiLoCo):
    """Saves the outer momentum and, on load, keeps the one it holds."""

    @override
    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        kept = self._momentum
        super().set_state_dict(module, optimizers, state, source=source)
        self._momentum = kept


class DiLoCoLoadsRankZerosModuleAlone(DiLoCo):
    """Loads every rank's own replica with the optimizers, and rank 0's on every rank without."""

    @override
    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        if optimizers:
            super().set_state_dict(module, optimizers, state, source=source)
        else:
            DDPStrategy.set_state_dict(self, module, optimizers, state, source=source)


class DiLoCoValidatesItsOwnReplica(DiLoCo):
    """Declares that it validates the replicas' mean, and validates each rank's own."""

    @override
    def on_validation_start(self) -> None:
        pass

    @override
    def on_validation_end(self) -> None:
        pass


class DiLoCoTrainsOnFromTheValidatedMean(DiLoCo):
    """Validates the replicas' mean, and leaves it in place: training goes on from it."""

    @override
    def on_validation_end(self) -> None:
        self._validating = []


def outer_adamw(parameters: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """DiLoCo's outer optimizer as an AdamW with weight decay."""
    return torch.optim.AdamW(parameters, lr=0.3, betas=(0.9, 0.95), weight_decay=0.1)


def outer_halving(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """The outer learning rate halved at each meeting."""
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


class DiLoCoAdamW(LocalSGDStrategy):
    """DiLoCo every 4 steps with an outer AdamW on a halving schedule (correct)."""

    def __init__(self, *, precision: str | None = None, checkpoint_io: str | None = None) -> None:
        super().__init__(
            sync_every=4,
            outer_optimizer=outer_adamw,
            outer_scheduler=outer_halving,
            precision=precision,
            checkpoint_io=checkpoint_io,
        )


class DiLoCoAdamWMadeAnewAtEachMeeting(DiLoCoAdamW):
    """Makes its outer AdamW and schedule anew at each meeting: their state is lost."""

    @override
    def meet(self, fragments: Collection[int] | None = None) -> None:
        self._anchor = [parameter.detach().clone() for parameter in self._anchor]
        self._make_outer()
        super().meet(fragments)


class AveragesOverItsSavedWorldSize(_Unwrapped):
    """Declares itself resizable, and averages gradients over the world size it was saved at."""

    saved_world_size: int | None = None

    @property
    @override
    def training_semantics(self) -> TrainingSemantics:
        return TrainingSemantics(resizable=True)

    @override
    def synchronise(self) -> None:
        size = self.saved_world_size or self.world_size
        for parameter in self._parameters:
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad, group=self.process_group)
                parameter.grad /= size

    @override
    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        state = super().get_state_dict(module, optimizers)
        state["world_size"] = self.saved_world_size or self.world_size
        return state

    @override
    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        super().set_state_dict(module, optimizers, state, source=source)
        saved = state.get("world_size")
        if isinstance(saved, int):
            self.saved_world_size = saved


class StreamingDiLoCo(DiLoCo):
    """Streaming DiLoCo (correct): two fragments each meeting every 4 steps, staggered by 2."""

    def __init__(self, *, precision: str | None = None, checkpoint_io: str | None = None) -> None:
        super().__init__(fragments=2, precision=precision, checkpoint_io=checkpoint_io)


class DiLoCoPerGroup(DiLoCo):
    """DiLoCo with a period per group (correct): the first half every 2 steps, the rest 4."""

    def __init__(self, *, precision: str | None = None, checkpoint_io: str | None = None) -> None:
        super().__init__(periods=(2, 4), precision=precision, checkpoint_io=checkpoint_io)


class _MeetingAllAtOnce(DiLoCo):
    """Meets every part of the parameters at once every ``sync_every`` steps."""

    @override
    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: object | None = None
    ) -> object:
        result = DDPStrategy.optimizer_step(self, optimizer, closure)  # type: ignore[arg-type]
        self.steps += 1
        if self.steps % self.sync_every == 0:
            self.meet()
        return result

    @override
    def on_train_end(self) -> None:
        if self.steps % self.sync_every:
            self.meet()


class DiLoCoPerGroupMeetingTogether(_MeetingAllAtOnce, DiLoCoPerGroup):
    """Declares a period per group and meets every group every 4 steps."""


class StreamingDiLoCoMeetingAllAtOnce(_MeetingAllAtOnce, StreamingDiLoCo):
    """Declares two staggered fragments and meets them all at once every 4 steps."""


class _OnMesh(ModelParallelStrategy):
    """`ModelParallelStrategy` on the mesh its class names, every other rank along it (correct)."""

    data: ClassVar[int] = 1
    tensor: ClassVar[int | Literal["auto"]] = 1
    context: ClassVar[int] = 1
    pipeline_size: ClassVar[int] = 1

    def __init__(self, *, precision: str | None = None, checkpoint_io: str | None = None) -> None:
        super().__init__(
            data_parallel_size=self.data,
            tensor_parallel_size=self.tensor,
            context_parallel_size=self.context,
            pipeline_parallel_size=self.pipeline_size,
            precision=precision,
            checkpoint_io=checkpoint_io,
        )


class _TensorParallel(_OnMesh):
    """Every rank in one tensor-parallel group (correct)."""

    tensor = "auto"


class MeshLaysOutNoMesh(_TensorParallel):
    """Lays the job out as plain data parallelism: tensor-parallel ranks read other data."""

    @property
    @override
    def layout(self) -> ProcessLayout:
        return ProcessLayout(world_size=self.world_size, global_rank=self.global_rank)


class _Pipelined(ModelParallelStrategy):
    """`ModelParallelStrategy` with every rank a pipeline stage (correct, but for its hooks)."""

    def __init__(self, *, precision: str | None = None, checkpoint_io: str | None = None) -> None:
        super().__init__(pipeline_parallel_size=2, precision=precision, checkpoint_io=checkpoint_io)

    def units_kept(self, units: Sequence[str]) -> Sequence[str]:
        """The units the stages are cut from."""
        return units

    def made(self, pipeline: Pipeline) -> None:
        """What becomes of the pipeline once made."""

    @override
    def pipeline(
        self,
        module: torch.nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        units: Sequence[str] | None = None,
        stages: Sequence[Sequence[str]] | None = None,
        schedule: str | None = None,
        microbatches: int | None = None,
        stages_per_rank: int | None = None,
    ) -> Pipeline:
        made = super().pipeline(
            module,
            loss_fn,
            units=None if units is None else self.units_kept(units),
            stages=stages,
            schedule=schedule,
            microbatches=microbatches,
            stages_per_rank=stages_per_rank,
        )
        self.made(made)
        return made


class PipelineMissesALayer(_Pipelined):
    """Cuts the stages from the units it is given less the second (an activation)."""

    @override
    def units_kept(self, units: Sequence[str]) -> Sequence[str]:
        return [unit for unit in units if unit != units[1]]


class PipelineStageSkipsItsBackward(_Pipelined):
    """The first stage's backward never reaches its parameters: they keep no gradient."""

    _skipped: torch.nn.Module | None = None

    @override
    def made(self, pipeline: Pipeline) -> None:
        self._skipped = pipeline.parts[0] if pipeline.has_first_stage else None

    @override
    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], object] | None = None
    ) -> object:
        if self._skipped is not None:
            for parameter in self._skipped.parameters():
                parameter.grad = None
        return super().optimizer_step(optimizer, closure)


class _ContextParallel(_OnMesh):
    """Two context-parallel ranks (correct)."""

    context = 2


class ContextShardsOverDataOnly(_ContextParallel):
    """Shards the module over ``dp_shard`` alone with cp = 2: cp ranks' gradients never summed."""

    @property
    @override
    def data_parallel_mesh(self) -> DeviceMesh:
        return self.device_mesh["dp_shard"]

    @override
    def _check_parallelized(self, module: torch.nn.Module) -> None:
        pass


class ContextMasksInLocalOrder(_ContextParallel):
    """Masks causally by contiguous slices, while the sequence is split load-balanced."""

    @override
    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        is_causal: bool = False,
    ) -> torch.Tensor:
        group = self.context_parallel_group
        length = query.shape[-2]
        rank = self.mesh_shape.coordinates(self.global_rank)["cp"]
        contiguous = torch.arange(rank * length, (rank + 1) * length)
        return context_parallel_attention(
            query, key, value, group=group, positions=contiguous, is_causal=is_causal
        )


class MeshLoadsTheModulesAlone(_TensorParallel):
    """Loads a checkpoint's modules and leaves the optimizers as they are."""

    @override
    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        super().set_state_dict(module, (), state, source=source)


class DeclaresItsModuleParallelizesItself(DDPStrategy):
    """Declares a module that parallelizes itself, with no mesh to parallelize it over."""

    @property
    @override
    def training_semantics(self) -> TrainingSemantics:
        return TrainingSemantics(parallelized_by_module=True)
