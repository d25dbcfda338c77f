"""The user's side of training: a `Module` with its steps, and an optional `DataModule`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from typing_extensions import Self, override

from plait.core import (
    ConfigurationError,
    PipelineModule,
    SupportsContextParallel,
    SupportsDeviceMesh,
    SupportsPipeline,
)
from plait.trainer.data_module import LOADER_METHODS, DataModule, ModuleData, defines
from plait.trainer.hparams import HyperParameters, SavesHyperParameters, load_module
from plait.trainer.lightning_module import ManualOptimizationCalls, ModuleHooks
from plait.trainer.values import LogValue, ReduceFx, StepOutput

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from plait.core.typing import PathLike
    from plait.trainer.trainer import Trainer

__all__ = [
    "LOADER_METHODS",
    "DataModule",
    "HyperParameters",
    "LogValue",
    "Module",
    "ModuleData",
    "ReduceFx",
    "SavesHyperParameters",
    "StepOutput",
    "defines",
    "overrides",
]

_REDUCE_FX: tuple[ReduceFx, ...] = ("mean", "sum", "max", "min")


class Module(SavesHyperParameters, ManualOptimizationCalls, ModuleHooks, torch.nn.Module):
    """A `torch.nn.Module` that knows how to train itself: override its steps.

    Only `training_step` and `configure_optimizers` are needed for `Trainer.fit`;
    `validation_step`, `test_step` and `predict_step` for the other loops. The
    hooks (``on_train_start``, ...) run on every rank; override those you need.

    Example::

        class Classifier(Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = torch.nn.Linear(64, 10)

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = torch.nn.functional.cross_entropy(self.net(x), y)
                self.log("train_loss", loss, prog_bar=True)
                return loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)
    """

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None
        self._automatic_optimization = True
        # Each parameter's requires_grad, while an optimizer is toggled.
        self._toggled: list[tuple[torch.nn.Parameter, bool]] | None = None

    @property
    def trainer(self) -> Trainer:
        """The trainer running this module.

        Raises:
            ConfigurationError: No trainer runs it (outside `Trainer.fit` and the others).
        """
        if self._trainer is None:
            raise ConfigurationError(
                f"{type(self).__name__} is not attached to a Trainer",
                fix="call trainer.fit(module) (or validate, test, predict); "
                "self.trainer and self.log work inside the steps and hooks it runs",
            )
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        # The Trainer attaches itself for each run, and lets go at its end.
        self._trainer = trainer

    @property
    def attached(self) -> bool:
        """Whether a trainer runs this module now."""
        return self._trainer is not None

    # Hyperparameters: `SavesHyperParameters`'s.

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: PathLike,
        map_location: str | torch.device | None = None,
        strict: bool = True,
        **overrides: object,
    ) -> Self:
        """Make this class from a checkpoint's hyperparameters and load its weights.

        In this process, without a process group, from any checkpoint plait writes:
        a file, a directory of FSDP's shards (``torch.distributed.checkpoint``) or
        a DeepSpeed directory (rebuilt whole). ``overrides`` replace or complete
        the saved hyperparameters; ``map_location`` moves the module after loading.
        The module is returned in eval mode.

        Raises:
            CheckpointError: It cannot be read, or holds no module state.
            ConfigurationError: It is a checkpoint of another class, or an argument
                of ``__init__`` is neither saved nor given.
        """
        return load_module(
            cls, checkpoint_path, map_location=map_location, strict=strict, overrides=overrides
        )

    @property
    def automatic_optimization(self) -> bool:
        """Whether the trainer steps the optimizers (``True``, the default).

        Set it to ``False`` (in ``__init__``) for manual optimization: then
        ``training_step`` calls `manual_backward` and steps the optimizers from
        `optimizers` itself, as often as it likes, and steps its schedulers from
        `lr_schedulers`; the trainer neither clips nor accumulates.
        """
        return bool(self.__dict__.get("_automatic_optimization", True))

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ConfigurationError(
                f"automatic_optimization={value!r} is not a bool",
                value=value,
                fix="set self.automatic_optimization = False for manual optimization",
            )
        self.__dict__["_automatic_optimization"] = value

    @override
    def __getstate__(self) -> dict[str, object]:
        # A module travels to the ranks without its trainer: each rank has its own;
        # nor compiled (a run compiles it again in each rank, when asked), nor with
        # the steps its runs went through (each rank's job makes its own).
        state = {**self.__dict__, "_trainer": None, "_compiled_call_impl": None}
        state.pop("_plait_steps", None)
        return state

    # The steps.

    def training_step(self, batch: object, batch_idx: int) -> StepOutput:
        """Compute the loss of one training batch (a tensor, or a mapping with ``"loss"``)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define training_step(batch, batch_idx), "
            "which Trainer.fit needs"
        )

    def validation_step(self, batch: object, batch_idx: int) -> object:
        """Evaluate one validation batch; log what you measure with `log`."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define validation_step(batch, batch_idx)"
        )

    def test_step(self, batch: object, batch_idx: int) -> object:
        """Evaluate one test batch; log what you measure with `log`."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define test_step(batch, batch_idx)"
        )

    def predict_step(self, batch: object, batch_idx: int) -> object:
        """The prediction for one batch; by default the module's output on it."""
        return self(batch)

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The strategy's device mesh: what ``configure_model`` parallelizes the module over.

        With ``ModelParallelStrategy``, a mesh named ``("dp_replicate", "dp_shard",
        "tp")``: in ``configure_model``, apply tensor parallelism over
        ``self.device_mesh["tp"]``, then FSDP over ``self.device_mesh["dp_shard"]``.
        ``None`` where no trainer runs the module (``load_from_checkpoint`` builds it
        in one process) or its strategy lays out no mesh: leave the module whole then.
        """
        trainer = self._trainer
        strategy: object = trainer.strategy if trainer is not None else None
        return strategy.device_mesh if isinstance(strategy, SupportsDeviceMesh) else None

    @property
    def context_parallel_group(self) -> torch.distributed.ProcessGroup | None:
        """The ``cp`` group this rank's attention gathers keys and values over.

        For ``plait.strategies.context_parallel.context_parallel_attention(...,
        group=self.context_parallel_group)``: ``None`` (plain attention) where the
        strategy does not split sequences (`plait.core.SupportsContextParallel`), or
        no trainer runs the module.
        """
        strategy = self._context_parallel_strategy()
        return strategy.context_parallel_group if strategy is not None else None

    def sequence_positions(self, length: int) -> torch.Tensor:
        """The global positions of this rank's tokens of a sequence of ``length``.

        Under context parallelism this rank's slice (load-balanced as the strategy
        was asked); otherwise ``arange(length)``. For a position embedding and for
        the attention's causal mask.
        """
        strategy = self._context_parallel_strategy()
        if strategy is not None:
            return strategy.sequence_positions(length)
        return torch.arange(length)

    def shard_sequence(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of ``tensor`` along ``dim``: all of them without cp.

        Call it on a batch's inputs and targets alike in ``training_step`` (and the
        other steps): the ranks of a ``cp`` group read the same batches.
        """
        strategy = self._context_parallel_strategy()
        return strategy.shard_sequence(tensor, dim) if strategy is not None else tensor

    def pipeline(
        self,
        network: torch.nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        units: Sequence[str] | None = None,
        stages: Sequence[Sequence[str]] | None = None,
    ) -> torch.nn.Module:
        """``network`` as a pipeline: called with a batch and ``target=``, it gives the loss.

        Under a strategy with pipeline ranks (``ModelParallelStrategy(
        pipeline_parallel_size=N)``, `plait.core.SupportsPipeline`) this rank's stages
        of ``network``, cut where ``units`` (its submodules' names in forward order,
        split evenly) or ``stages`` (one list of names per stage) say, as a
        `plait.strategies.pipeline.Pipeline`: its call runs the schedule's forward
        and backward in training (the Trainer's backward pass adds nothing; the
        strategy divides the gradients by the batches accumulated,
        `plait.core.SupportsAccumulation`) and the forward alone in validation, and
        returns the mean loss on every rank. Anywhere else (another strategy,
        ``pipeline_parallel_size=1``, no trainer) the network whole, as a
        `plait.strategies.whole_pipeline.WholePipeline` under the same parameter
        names: call it the same way. Either is a `plait.core.PipelineModule`.

        Call it in `configure_model`, keeping the result where the network was
        (``self.model = self.pipeline(self.model, loss_fn, units=...)``), then
        parallelize each of its ``parts`` as you would the whole network; the
        network's ``forward`` must skip a submodule that is ``None`` (another
        stage's). Checkpoints keep the whole network's names either way.
        """
        if isinstance(network, PipelineModule):
            return network  # a later run of the job: made already
        trainer = self._trainer
        strategy: object = trainer.strategy if trainer is not None else None
        if isinstance(strategy, SupportsPipeline) and strategy.pipeline_parallel_size > 1:
            return strategy.pipeline(network, loss_fn, units=units, stages=stages)
        from plait.strategies.pipeline_plan import check_declaration  # noqa: PLC0415
        from plait.strategies.whole_pipeline import WholePipeline  # noqa: PLC0415

        # Checked here too: a declaration that a pipeline would refuse is refused
        # in one process, before it is run on many.
        check_declaration(network, units=units, stages=stages)
        return WholePipeline(network, loss_fn)

    def _context_parallel_strategy(self) -> SupportsContextParallel | None:
        trainer = self._trainer
        strategy: object = trainer.strategy if trainer is not None else None
        return strategy if isinstance(strategy, SupportsContextParallel) else None

    def configure_model(self) -> None:
        """Create the layers that should be built under the strategy's control; none by default.

        Runs on every rank at the start of every run (fit, validate, test, predict),
        inside ``strategy.model_sharded_context()``: with a sharding strategy
        (``FSDPStrategy``) layers made here are created on the meta device and each
        rank materialises only its shards, so a model larger than one process's
        memory can be built. Create a layer only if it is not there yet (the hook
        runs once per run). With ``ModelParallelStrategy`` this is where the module
        parallelizes itself over `device_mesh` (once: a later run of the job finds
        it parallelized already). Lightning 1.x called it ``configure_sharded_model``.
        """
        legacy = getattr(self, "configure_sharded_model", None)
        if callable(legacy):
            legacy()

    def configure_optimizers(self) -> object:
        """The optimizers, and optionally learning-rate schedulers.

        Return one of: an optimizer; a list of optimizers; a pair
        ``([optimizers], [schedulers])``; or a dict (or a list of dicts)
        ``{"optimizer": ..., "lr_scheduler": scheduler_or_config}``, where a
        scheduler config is ``{"scheduler": ..., "interval": "epoch" | "step",
        "frequency": 1, "monitor": "val_loss"}`` (``monitor`` for
        ``ReduceLROnPlateau``).
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not define configure_optimizers(), which Trainer.fit needs"
        )

    # Logging.

    def log(
        self,
        name: str,
        value: LogValue,
        *,
        prog_bar: bool = False,
        logger: bool = True,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: ReduceFx = "mean",
        sync_dist: bool = False,
        batch_size: int | None = None,
    ) -> None:
        """Record a metric for the loggers, the progress bar and the callbacks.

        Args:
            name: The metric's name, e.g. ``"val_loss"``.
            value: A number or a one-element tensor; or a metric object that keeps its
                own state (a torchmetrics ``Metric``, `MetricObject`), as Lightning
                takes one: per step its value for the batch it was last called on,
                per epoch its ``compute()`` (which syncs over the ranks itself, so
                ``sync_dist`` and ``reduce_fx`` do not apply), and it is reset when
                the epoch ends.
            prog_bar: Show it in the progress bar.
            logger: Send it to the loggers.
            on_step: Record each value as it comes; by default in training only.
            on_epoch: Record the epoch's value (values folded with ``reduce_fx``);
                by default outside training only.
            reduce_fx: How the epoch's values are folded: ``"mean"`` (weighted by
                ``batch_size``), ``"sum"``, ``"max"`` or ``"min"``.
            sync_dist: Fold the values of every rank too, through the strategy's
                collectives (an integer's mean is never truncated).
            batch_size: The weight of this value in an epoch mean; by default the
                length of the batch's first tensor.

        Raises:
            ConfigurationError: No trainer runs the module, or an argument is invalid.
        """
        self.trainer.results.record(
            name,
            value,
            prog_bar=prog_bar,
            logger=logger,
            on_step=on_step,
            on_epoch=on_epoch,
            reduce_fx=check_reduce_fx(reduce_fx),
            sync_dist=sync_dist,
            batch_size=batch_size,
        )

    def log_dict(self, values: Mapping[str, LogValue], **options: object) -> None:
        """`log` each item of ``values`` with the same options."""
        for name, value in values.items():
            self.log(name, value, **options)  # type: ignore[arg-type]


def overrides(module: Module, method: str) -> bool:
    """Whether ``module``'s class defines its own ``method`` (a step or hook of `Module`)."""
    return getattr(type(module), method) is not getattr(Module, method)


def check_reduce_fx(value: object) -> ReduceFx:
    """``value`` as a `ReduceFx`.

    Raises:
        ConfigurationError: It is not one.
    """
    for choice in _REDUCE_FX:
        if value == choice:
            return choice
    raise ConfigurationError.invalid_choice("reduce_fx", value, _REDUCE_FX)
