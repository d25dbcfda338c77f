"""The user's side of training: a `Module` with its steps, and an optional `DataModule`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import torch
from typing_extensions import Self, override

from plait.core import (
    ConfigurationError,
    PipelineModule,
    SupportsContextParallel,
    SupportsDeviceMesh,
    SupportsPipeline,
)
from plait.trainer.hparams import caller_arguments, load_module

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    from plait.core import GradientClipAlgorithm
    from plait.core.typing import Checkpoint, PathLike
    from plait.trainer.attach import Attached
    from plait.trainer.metric_objects import MetricObject
    from plait.trainer.optimization import TrainerOptimizer
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

LogValue: TypeAlias = "torch.Tensor | float | int | bool | MetricObject"
"""What `Module.log` takes: a number, a one-element tensor, or a metric object (torchmetrics')."""

ReduceFx: TypeAlias = Literal["mean", "sum", "max", "min"]
"""How `Module.log` folds a metric's values over an epoch (and over ranks)."""

StepOutput: TypeAlias = "torch.Tensor | Mapping[str, object] | None"
"""What `Module.training_step` returns: the loss, a mapping with ``"loss"``, or ``None`` to skip."""

_REDUCE_FX: tuple[ReduceFx, ...] = ("mean", "sum", "max", "min")


class HyperParameters(dict[str, object]):
    """A module's hyperparameters: a dict whose items read as attributes too (``hparams.lr``)."""

    # Any: each value has the type the user gave it, which no annotation here knows.
    def __getattr__(self, name: str) -> Any:
        """The item ``name``.

        Raises:
            AttributeError: There is no such hyperparameter.
        """
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"no hyperparameter {name!r}; saved: {', '.join(sorted(self)) or 'none'}"
            ) from None

    @override
    def __setattr__(self, name: str, value: object) -> None:
        self[name] = value


class SavesHyperParameters:
    """``save_hyperparameters`` and ``hparams``, as a `Module` and a `DataModule` have them."""

    def save_hyperparameters(
        self, *names: str, ignore: Sequence[str] | str = (), logger: bool = True
    ) -> None:
        """Save the calling ``__init__``'s arguments as `hparams`, in checkpoints and logs.

        Call it in ``__init__``: the arguments (all, or those named; less those in
        ``ignore``) become `hparams`, go into every checkpoint (so that
        `Module.load_from_checkpoint` can make the module again; a data module's as
        ``"datamodule_hyper_parameters"``) and, with ``logger``, to the loggers'
        ``log_hyperparams`` when a run starts (a module's and a data module's
        together: a name both hold with different values is refused).

        A module among them (a ``net`` argument) is kept in `hparams` with a warning,
        and left out of checkpoints and logs (its weights are the state dict's):
        pass it to `Module.load_from_checkpoint` again.

        Raises:
            ConfigurationError: A name is not an argument, or a value is not plain
                data (numbers, strings, lists, dicts) nor a module: ignore it and
                pass it to `Module.load_from_checkpoint` instead.
        """
        self.hparams.update(caller_arguments(names, ignore))
        # Through __dict__: a torch module's attribute setting is its own.
        self.__dict__["_log_hyperparams"] = logger

    @property
    def hparams(self) -> HyperParameters:
        """The hyperparameters `save_hyperparameters` saved (empty by default)."""
        found = self.__dict__.get("_hparams")
        if found is None:
            found = self.__dict__["_hparams"] = HyperParameters()
        assert isinstance(found, HyperParameters)
        return found

    @property
    def logs_hyperparameters(self) -> bool:
        """Whether the loggers get the hyperparameters (``save_hyperparameters(logger=...)``)."""
        return bool(self.__dict__.get("_log_hyperparams", True)) and bool(self.hparams)


class Module(SavesHyperParameters, torch.nn.Module):
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

    # Optimization by hand.

    def _running(self, what: str) -> Attached:
        trainer = self._trainer  # read as it is (not through `trainer`): called every step
        attached = trainer.attached if trainer is not None else None
        if attached is None:
            raise ConfigurationError(
                f"{what} was called where no run is in progress",
                fix=f"call {what} inside training_step or a hook of a running fit",
            )
        return attached

    def optimizers(self) -> TrainerOptimizer | list[TrainerOptimizer]:
        """The run's optimizers, stepped through the strategy: one, or a list of several.

        Raises:
            ConfigurationError: No fit is running.
        """
        handles = self._running("optimizers()").handles
        return handles[0] if len(handles) == 1 else list(handles)

    def lr_schedulers(
        self,
    ) -> LRScheduler | ReduceLROnPlateau | list[LRScheduler | ReduceLROnPlateau] | None:
        """The run's learning-rate schedulers: none, one, or a list of several.

        Under manual optimization the trainer does not step them: call ``step()``.

        Raises:
            ConfigurationError: No fit is running.
        """
        schedulers = [config.scheduler for config in self._running("lr_schedulers()").schedulers]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor) -> None:
        """Compute the gradients of ``loss`` through the strategy (manual optimization).

        The strategy and its precision run the backward pass: the loss is scaled for
        ``16-mixed``, DeepSpeed's engine runs it, and DDP and FSDP synchronise the
        gradients (not inside ``toggle_model(sync_grad=False)``).

        Raises:
            ConfigurationError: Under automatic optimization (the trainer runs the
                backward pass of the loss ``training_step`` returns), or outside a fit.
        """
        if self.__dict__.get("_automatic_optimization", True):  # automatic_optimization
            raise ConfigurationError(
                "manual_backward was called under automatic optimization: the trainer "
                "runs the backward pass of the loss training_step returns, and would run "
                "a second one",
                value="automatic_optimization=True",
                fix="set self.automatic_optimization = False in __init__ to step the "
                "optimizers yourself, or return the loss and drop manual_backward",
            )
        attached = self._running("manual_backward")
        attached.hooks.on_before_backward(loss)
        attached.hooks.trainer.strategy.backward(loss, attached.wrapped)
        attached.hooks.on_after_backward()

    def toggle_optimizer(self, optimizer: TrainerOptimizer | torch.optim.Optimizer) -> None:
        """Until `untoggle_optimizer`, the other optimizers' parameters take no gradients.

        For several optimizers over parts of one model (a GAN's generator and
        discriminator): a backward pass then leaves the others' gradients alone.
        Both the parameters the optimizers hold and those the module holds now
        are toggled: a sharded module (FSDP) runs its step on gathered copies.

        Raises:
            ConfigurationError: Another optimizer is toggled already, or
                ``optimizer`` is not one of the run's.
        """
        if self._toggled is not None:
            raise ConfigurationError(
                "toggle_optimizer was called while another optimizer is toggled",
                fix="call untoggle_optimizer(optimizer) before toggling the next one",
            )
        handles = self._running("toggle_optimizer").handles
        chosen = _handle_of(optimizer, handles)
        others = [handle for handle in handles if handle is not chosen]
        frozen = set().union(*(h.parameter_names for h in others)) - chosen.parameter_names
        kept = {id(p) for group in chosen.optimizer.param_groups for p in group["params"]}
        saved: dict[int, tuple[torch.nn.Parameter, bool]] = {}

        def freeze(parameter: torch.nn.Parameter) -> None:
            saved.setdefault(id(parameter), (parameter, parameter.requires_grad))
            parameter.requires_grad = False

        for name, parameter in self.named_parameters():  # as the module holds them now
            if name in frozen:
                freeze(parameter)
        for handle in others:  # as the optimizers hold them (shards, for FSDP)
            for group in handle.optimizer.param_groups:
                for parameter in group["params"]:
                    if id(parameter) not in kept:
                        freeze(parameter)
        self._toggled = list(saved.values())

    def untoggle_optimizer(self, optimizer: TrainerOptimizer | torch.optim.Optimizer) -> None:
        """Give every parameter back the ``requires_grad`` it had before `toggle_optimizer`."""
        for parameter, requires_grad in self._toggled or ():
            parameter.requires_grad = requires_grad
        self._toggled = None

    def clip_gradients(
        self,
        optimizer: TrainerOptimizer | torch.optim.Optimizer,
        gradient_clip_val: float,
        gradient_clip_algorithm: GradientClipAlgorithm = "norm",
    ) -> None:
        """Clip ``optimizer``'s gradients through the strategy (manual optimization).

        Raises:
            ConfigurationError: Outside a fit.
        """
        attached = self._running("clip_gradients")
        inner = getattr(optimizer, "optimizer", optimizer)
        assert isinstance(inner, torch.optim.Optimizer)
        self.trainer.strategy.clip_gradients(
            attached.wrapped, inner, gradient_clip_val, gradient_clip_algorithm
        )

    # Hooks, each a no-op by default.

    def prepare_data(self) -> None:
        """Fetch or write data once per job, on global rank 0, before ``setup`` (a hook)."""

    def setup(self, stage: str) -> None:
        """At the start of every run, on every rank, before the module is set up (a hook).

        ``stage`` is ``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``.
        """

    def teardown(self, stage: str) -> None:
        """At the end of every run, however it ends, on every rank (a hook)."""

    def on_fit_start(self) -> None:
        """Once, before the first epoch, on every rank."""

    def on_fit_end(self) -> None:
        """Once, after the last epoch, on every rank."""

    def on_train_start(self) -> None:
        """When the training loop starts (after the sanity check), on every rank."""

    def on_train_end(self) -> None:
        """When the training loop reached its end (not when it failed), on every rank."""

    def on_train_epoch_start(self) -> None:
        """Before each training epoch."""

    def on_train_epoch_end(self) -> None:
        """After each training epoch (and its validation)."""

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        """Before each training batch."""

    def on_train_batch_end(self, outputs: StepOutput, batch: object, batch_idx: int) -> None:
        """After each training batch."""

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Before the backward pass of ``loss`` (the Trainer's, or `manual_backward`'s).

        With a pipeline (`pipeline`), at the same place, though its schedule ran the
        backward inside the call already: the batch's gradients are there.
        """

    def on_after_backward(self) -> None:
        """After a backward pass, before the gradients are clipped or stepped with."""

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """After the gradients are final (and clipped), before ``optimizer`` steps."""

    def on_validation_start(self) -> None:
        """Before a validation run (before `on_validation_epoch_start`)."""

    def on_validation_end(self) -> None:
        """After a validation run, its values folded into ``trainer.callback_metrics``."""

    def on_validation_epoch_start(self) -> None:
        """Before each validation run."""

    def on_validation_epoch_end(self) -> None:
        """After each validation run; logged epoch values are not folded yet."""

    def on_test_start(self) -> None:
        """Before the test run (before `on_test_epoch_start`)."""

    def on_test_end(self) -> None:
        """After the test run, its values folded into ``trainer.callback_metrics``."""

    def on_test_epoch_start(self) -> None:
        """Before the test run."""

    def on_test_epoch_end(self) -> None:
        """After the test run."""

    def on_predict_start(self) -> None:
        """Before the predict run."""

    def on_predict_end(self) -> None:
        """After the predict run."""

    def on_save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Add to (or change) ``checkpoint`` before it is written."""

    def on_load_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Read what `on_save_checkpoint` added, before the state is restored."""


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


def _handle_of(
    optimizer: TrainerOptimizer | torch.optim.Optimizer, handles: list[TrainerOptimizer]
) -> TrainerOptimizer:
    for handle in handles:
        if optimizer is handle or optimizer is handle.optimizer:
            return handle
    raise ConfigurationError(
        f"{type(optimizer).__name__} is not one of the run's optimizers",
        value=optimizer,
        fix="pass an optimizer from self.optimizers()",
    )


class DataModule(SavesHyperParameters):
    """The data of a run, kept apart from the model: override the loaders you have.

    ``setup(stage)`` runs on every rank before the loaders are asked for, with
    ``stage`` one of ``"fit"``, ``"validate"``, ``"test"``, ``"predict"``;
    ``prepare_data()`` runs once per job, on global rank 0, before it (download
    there, never in ``setup``). ``self.trainer`` is the trainer of the running run
    (``self.trainer.world_size`` in ``setup``), ``None`` outside one.
    """

    trainer: Trainer | None = None
    """The trainer of the running run, set before ``prepare_data`` and ``setup``."""

    def prepare_data(self) -> None:
        """Fetch or write data once per job (rank 0 only)."""

    def setup(self, stage: str) -> None:
        """Build the datasets for ``stage`` (on every rank)."""

    def train_dataloader(self) -> Iterable[object]:
        """The training loader."""
        raise NotImplementedError(f"{type(self).__name__} has no train_dataloader()")

    def val_dataloader(self) -> Iterable[object]:
        """The validation loader."""
        raise NotImplementedError(f"{type(self).__name__} has no val_dataloader()")

    def test_dataloader(self) -> Iterable[object]:
        """The test loader."""
        raise NotImplementedError(f"{type(self).__name__} has no test_dataloader()")

    def predict_dataloader(self) -> Iterable[object]:
        """The prediction loader."""
        raise NotImplementedError(f"{type(self).__name__} has no predict_dataloader()")

    def has(self, stage_loader: str) -> bool:
        """Whether this data module overrides the loader method ``stage_loader``."""
        return getattr(type(self), stage_loader) is not getattr(DataModule, stage_loader)


LOADER_METHODS: Final = (
    "train_dataloader",
    "val_dataloader",
    "test_dataloader",
    "predict_dataloader",
)
"""The loader methods a `DataModule`, or a module that holds its own data, defines."""


def defines(module: Module, method: str) -> bool:
    """Whether ``module``'s class defines ``method`` (a hook Lightning modules may have)."""
    return callable(getattr(type(module), method, None))


class ModuleData(DataModule):
    """The data a module defines itself, as Lightning modules may: its loader methods.

    ``trainer.fit(model)`` with neither loaders nor a data module reads the model's
    ``train_dataloader()`` (and ``val_dataloader()``), and ``trainer.fit(model,
    train_loader)`` its ``val_dataloader()``; the module's own ``prepare_data`` and
    ``setup`` run as its hooks, whatever supplies the data.

    Args:
        module: The module with ``*_dataloader`` methods.
    """

    def __init__(self, module: Module) -> None:
        self.module = module

    @override
    def has(self, stage_loader: str) -> bool:
        return defines(self.module, stage_loader)

    def _loader(self, method: str) -> Iterable[object]:
        loader: Iterable[object] = getattr(self.module, method)()
        return loader

    @override
    def train_dataloader(self) -> Iterable[object]:
        return self._loader("train_dataloader")

    @override
    def val_dataloader(self) -> Iterable[object]:
        return self._loader("val_dataloader")

    @override
    def test_dataloader(self) -> Iterable[object]:
        return self._loader("test_dataloader")

    @override
    def predict_dataloader(self) -> Iterable[object]:
        return self._loader("predict_dataloader")
