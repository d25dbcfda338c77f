"""The Trainer: resolves the parts in one step, then runs fit, validate, test and predict."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Final, Literal

import attrs
from typing_extensions import override

from plait.core import (
    STOP_TIMEOUT,
    Accelerator,
    ConfigurationError,
    GradientClipAlgorithm,
    Precision,
    Strategy,
    publish_rank,
    rank_zero_info,
)
from plait.trainer.attach import attach, restore
from plait.trainer.callbacks.resolve import resolve_callbacks
from plait.trainer.checkpointing import Checkpointer, resolve_checkpoint
from plait.trainer.checks import check_count, check_root, check_timeout, compile_options
from plait.trainer.connector import Connection, Plugin, connect
from plait.trainer.launch import Launch, Outcome, origin
from plait.trainer.lightning_trainer import TrainerProperties
from plait.trainer.limits import Limits, Stage
from plait.trainer.loggers import Logger, resolve_loggers
from plait.trainer.loop_settings import LoopContext, LoopSettings, Setting
from plait.trainer.module import DataModule, Module, ModuleData, defines
from plait.trainer.module_checks import check_data, check_manual_optimization, check_module
from plait.trainer.optimization import (
    is_step_batch,
)
from plait.trainer.profiler import Profiler, make_profiler
from plait.trainer.progress import Progress
from plait.trainer.results import Results
from plait.trainer.stages import run_stage_loop
from plait.trainer.torch_flags import Deterministic, TorchFlags

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, DeviceSpec, PathLike
    from plait.trainer.callbacks.base import Callback
    from plait.trainer.metrics import Number
    from plait.trainer.run_state import Attached, Run

__all__ = ["Trainer"]

_DEFAULT_CHECKPOINT_TIMEOUT: Final = 1800.0


class Trainer(TrainerProperties):
    """Trains a `Module` with a strategy built from the parts you name.

    Every setting is checked here, when the trainer is made, before any process
    starts: the accelerator, devices, precision, plugins and strategy are resolved
    in one step (`plait.trainer.connector.connect`), and the choices and their
    reasons are logged (``logging.getLogger("plait.trainer")``) and kept in
    `reasons`.

    Args:
        accelerator: ``"auto"``, a registered name (``"cpu"``, ``"cuda"``, ...) or an
            `Accelerator`.
        strategy: ``"auto"`` (one process, or ``"ddp"`` for several), a registered
            name (``"ddp"``, ``"ddp_spawn"``, yours) or a `Strategy`.
        devices: How many devices (processes on the CPU), which ones
            (``[0, 2]``), ``-1`` for all, or ``"auto"``.
        num_nodes: Machines in the job (started by torchrun or a scheduler).
        precision: ``"32-true"`` by default; ``"bf16-mixed"``, ``"16-mixed"``,
            ``"64-true"``, ... or a `Precision`.
        plugins: A precision, checkpoint IO, cluster environment or layer sync
            (`TorchSyncBatchNorm`, or a `LayerSync` of yours), each at most once
            (instances, or precision and checkpoint IO names).
        logger: ``True`` for a `CSVLogger` under ``default_root_dir``, ``False``
            for none, or loggers of your own.
        callbacks: Callbacks to run; a `ModelCheckpoint` and a `RichProgressBar`
            are added unless you pass your own or switch them off.
        max_epochs: Stop after this many epochs (1000 when neither this nor
            ``max_steps`` is given).
        max_steps: Stop after this many optimizer steps (-1: no limit).
        min_epochs: Train at least this many epochs: a stop asked before (by
            `EarlyStopping`, or ``trainer.should_stop``) waits until then.
        min_steps: Train at least this many optimizer steps, likewise.
        limit_train_batches: Train on only this many batches (an int) or this
            fraction of the loader (a float) each epoch.
        limit_val_batches: Validate on only this many batches, or this fraction.
        limit_test_batches: Test on only this many batches, or this fraction.
        limit_predict_batches: Predict only this many batches, or this fraction.
        val_check_interval: Validate every this many training batches (an int) or
            this fraction of an epoch (a float); 1.0 validates at each epoch's end.
        check_val_every_n_epoch: Validate in every n-th epoch only.
        log_every_n_steps: Send step values to the loggers every n optimizer steps.
        accumulate_grad_batches: Accumulate gradients over this many batches
            before each optimizer step (without gradient synchronisation on the
            batches in between, where the strategy supports it).
        gradient_clip_val: Clip gradients to this norm (or value) before each step;
            ``None`` or 0: no clipping.
        gradient_clip_algorithm: ``"norm"`` or ``"value"``.
        default_root_dir: Where logs and checkpoints go; the working directory by
            default.
        enable_progress_bar: Draw a progress bar on global rank 0.
        enable_checkpointing: Add a `ModelCheckpoint` when none is given.
        enable_model_summary: Add a `ModelSummary` when none is given (``False`` by
            default, where Lightning's is ``True``: no table unless asked).
        deterministic: ``True``: torch uses deterministic algorithms only (others
            raise), and ``CUBLAS_WORKSPACE_CONFIG`` is set to ``:4096:8`` unless set
            already, as cuBLAS needs; ``"warn"``: the same, others warn; ``False``:
            torch's default; ``None`` (the default): torch's setting is left alone.
        benchmark: ``torch.backends.cudnn.benchmark`` for the run; ``None`` leaves it
            (off for a deterministic run).
        sync_batchnorm: Turn each ``BatchNorm`` layer into ``SyncBatchNorm`` before
            the strategy wraps the module, on several processes (GPUs: torch
            synchronises batch norms on no other device).
        fast_dev_run: A debugging run: ``True`` (or n) runs one (n) batch of
            training, validation, test and prediction, in one epoch, writing no
            logs and no checkpoints.
        overfit_batches: Train and validate on the same first batches (a count,
            or a fraction of the training loader), in order, every epoch.
        num_sanity_val_steps: Validation batches run before training starts, to
            find a broken ``validation_step`` early (-1: all); nothing they log
            counts. 0 by default.
        detect_anomaly: Run training under ``torch.autograd.detect_anomaly``: a
            backward pass that makes NaN raises, naming the forward operation.
        compile: Compile the module's forward with ``torch.compile``, in place
            (``True``, or ``torch.compile``'s options: ``{"mode": ...,
            "backend": ...}``), in every run after ``configure_model`` and before
            the strategy wraps or shards it; checkpoints keep the module's own
            parameter names, and load into a module never compiled.
        profiler: ``"simple"`` (a time table of every step and hook),
            ``"advanced"`` (cProfile per region), ``"pytorch"`` (a
            ``torch.profiler`` trace), or a `Profiler`; each rank writes its report
            under ``<default_root_dir>/profiles`` at each run's end.
        checkpoint_timeout: How long the other ranks wait for a checkpoint being
            saved (seconds or a `timedelta`); saves of large models outlast the
            strategy's collective timeout, which still bounds everything else.
        stop_signals: The signals that stop training gracefully: every rank stops
            at the same batch, ``last.ckpt`` is written, and `fit` raises
            `TrainingStopped` (a `SystemExit` with status ``128 + signal``).
            ``"auto"``: SIGTERM, and SIGUSR1 under SLURM (its requeue signal);
            names, numbers, or ``()`` to leave every signal alone.
        stop_timeout: Seconds (or a `timedelta`) a graceful stop may take, from the
            signal to the end of its save; 25 by default, within the 30 s that
            torchrun and SLURM leave before SIGKILL. A rank that has not stopped by
            then (asleep in your code, or waiting for a rank that is gone) says
            where it was and kills itself (SIGKILL); an unfinished save is never
            put in place, so the newest complete checkpoint stays the newest.
            Launchers kill the ranks they started that are still running this long
            (and their grace period) after passing a signal on. ``None``: no bound.

    Raises:
        ConfigurationError: A setting is invalid, or parts cannot work together;
            the message names the value, the valid choices and a fix.
    """

    accumulate_grad_batches = Setting[int]()
    """Batches per optimizer step (`loop_settings`)."""
    gradient_clip_val = Setting[float | None]()
    """The norm (or value) gradients are clipped to before each step; ``None``: none."""
    gradient_clip_algorithm = Setting[GradientClipAlgorithm]()
    """``"norm"`` or ``"value"``."""
    stop_signals = Setting[tuple[signal.Signals, ...]]()
    """The signals that stop training gracefully."""
    stop_timeout = Setting[float | None]()
    """Seconds a graceful stop may take (``None``: no bound)."""
    detect_anomaly = Setting[bool]()
    """Whether training runs under ``torch.autograd.detect_anomaly``."""

    def __init__(
        self,
        *,
        accelerator: Accelerator | str = "auto",
        strategy: Strategy | str = "auto",
        devices: DeviceSpec = "auto",
        num_nodes: int = 1,
        precision: Precision | str | int | None = None,
        plugins: Sequence[Plugin] | Plugin | None = None,
        logger: bool | Logger | Sequence[Logger] = True,
        callbacks: Sequence[Callback] | Callback | None = None,
        max_epochs: int | None = None,
        max_steps: int = -1,
        min_epochs: int | None = None,
        min_steps: int | None = None,
        limit_train_batches: int | float = 1.0,
        limit_val_batches: int | float = 1.0,
        limit_test_batches: int | float = 1.0,
        limit_predict_batches: int | float = 1.0,
        val_check_interval: int | float = 1.0,
        check_val_every_n_epoch: int = 1,
        log_every_n_steps: int = 50,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: GradientClipAlgorithm = "norm",
        default_root_dir: PathLike | None = None,
        enable_progress_bar: bool = True,
        enable_model_summary: bool = False,
        enable_checkpointing: bool = True,
        deterministic: Deterministic = None,
        benchmark: bool | None = None,
        sync_batchnorm: bool = False,
        fast_dev_run: bool | int = False,
        overfit_batches: int | float = 0.0,
        num_sanity_val_steps: int = 0,
        detect_anomaly: bool = False,
        profiler: Profiler | str | None = None,
        compile: bool | Mapping[str, object] = False,  # noqa: A002 - torch.compile's, by name
        checkpoint_timeout: float | timedelta = _DEFAULT_CHECKPOINT_TIMEOUT,
        stop_signals: Literal["auto"] | Sequence[str | int] = "auto",
        stop_timeout: float | timedelta | None = STOP_TIMEOUT,
    ) -> None:
        publish_rank()  # lightning_utilities' rank_zero_only, where a project loaded it
        self.limits = Limits.resolve(
            max_epochs=max_epochs,
            max_steps=max_steps,
            min_epochs=min_epochs,
            min_steps=min_steps,
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches,
            limit_predict_batches=limit_predict_batches,
            val_check_interval=val_check_interval,
            check_val_every_n_epoch=check_val_every_n_epoch,
            fast_dev_run=fast_dev_run,
            overfit_batches=overfit_batches,
            num_sanity_val_steps=num_sanity_val_steps,
        )
        debug = bool(self.limits.fast_dev_run)
        if debug:
            # A debugging run leaves nothing behind: no logs, no checkpoints.
            logger = False
            rank_zero_info(
                f"fast_dev_run: {self.limits.fast_dev_run} batch(es) of each stage, "
                "without logs or checkpoints"
            )
        check_count(
            "log_every_n_steps", log_every_n_steps, minimum=1, example="log_every_n_steps=1"
        )
        # How fit steps, checked and resolved once; the attributes of the same names
        # read them (and remake them when set).
        self.loop_settings = LoopSettings(
            accumulate_grad_batches=accumulate_grad_batches,
            gradient_clip_algorithm=gradient_clip_algorithm,
            gradient_clip_val=gradient_clip_val,
            stop_signals=stop_signals,
            stop_timeout=stop_timeout,
            detect_anomaly=detect_anomaly,
        )
        self.checkpoint_timeout = check_timeout("checkpoint_timeout", checkpoint_timeout)
        # Checked now, not at the first save, when logs or checkpoints will go there.
        self.default_root_dir = check_root(
            default_root_dir, writes=(logger is True or enable_checkpointing) and not debug
        )
        self.connection: Connection = connect(
            accelerator=accelerator,
            strategy=strategy,
            devices=devices,
            num_nodes=num_nodes,
            precision=precision,
            plugins=plugins,
        )
        self.log_every_n_steps = log_every_n_steps
        self.torch_flags = TorchFlags.resolve(
            deterministic, benchmark, sync_batchnorm, self.connection.layer_sync
        )
        self.torch_flags.check_device(self.strategy, self.num_processes)
        self.profiler = make_profiler(profiler)
        self.compile_options = compile_options(compile)
        self.loggers = resolve_loggers(logger, self.default_root_dir)
        self.callbacks = resolve_callbacks(
            callbacks,
            enable_progress_bar,
            enable_checkpointing,
            debug=debug,
            summary=enable_model_summary,
        )
        # What outlives a run: the counters, and the values logged.
        self.progress = Progress()
        self.results = Results(
            self.loggers, self.progress, self.strategy, log_every_n_steps=log_every_n_steps
        )
        self.state_stage: Stage | None = None
        self.sanity_checking = False
        self._checkpointer = Checkpointer(
            self.strategy,
            self.progress,
            self.results,
            self.callbacks,
            timeout=self.checkpoint_timeout,
        )
        # What a run holds in this rank, while it runs.
        self._attached: Attached | None = None
        self._module: Module | None = None
        # Starting the ranks, and handing rank 0's result back.
        self._launch = Launch(self, self._checkpointer)
        self.trained_checkpoint_path: str | None = None
        """Where the last fit saved the module's final state when it trained spawned
        copies of a module its strategy shards (`plait.core.SupportsShardedModule`):
        the caller's module is left as it was, and nothing gathers the state whole
        (``type(model).load_from_checkpoint(path)`` reads it, in one process).
        ``None`` after any other run."""

    # What the trainer is made of.

    @property
    def strategy(self) -> Strategy:
        """The strategy, made with every part."""
        return self.connection.strategy

    @property
    def reasons(self) -> tuple[str, ...]:
        """What the connector chose for each part, and why (one line each)."""
        return self.connection.reasons

    @property
    def world_size(self) -> int:
        """Processes in the job: the running one's, else the last run's, else the one planned."""
        ran_as = self._launch.ran_as
        if self._attached is not None:
            return self.strategy.world_size
        return ran_as[0] if ran_as is not None else self.num_processes

    @property
    def global_rank(self) -> int:
        """This process's rank in the running job, else in the last run's.

        A process that started the job's ranks and waited for them (``ddp_spawn``)
        answers 0, as the rank whose outcome it took.
        """
        ran_as = self._launch.ran_as
        if self._attached is not None or ran_as is None:
            return self.strategy.global_rank
        return ran_as[1]

    @property
    def num_nodes(self) -> int:
        """Machines in the job."""
        return self.connection.num_nodes

    @property
    def is_global_zero(self) -> bool:
        """Whether this is global rank 0 (the one that logs and draws)."""
        if self._attached is not None:
            return self.strategy.is_global_zero
        return self.global_rank == 0

    @property
    def num_processes(self) -> int:
        """How many processes a run uses."""
        return self.connection.num_processes

    # Where training stands (the counters outlive a run).

    @property
    def current_epoch(self) -> int:
        """The epoch being run (epochs finished, between epochs)."""
        return self.progress.current_epoch

    @current_epoch.setter
    def current_epoch(self, value: int) -> None:
        self.progress.current_epoch = value

    @property
    def global_step(self) -> int:
        """Optimizer steps taken."""
        return self.progress.global_step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self.progress.global_step = value

    @property
    def should_stop(self) -> bool:
        """Whether training stops at the end of this epoch; set it to stop (any rank may)."""
        return self.progress.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.progress.should_stop = value

    @property
    def max_epochs(self) -> int | None:
        """Epochs to train (``None``: ``max_steps`` stops training); settable between runs."""
        return self.limits.max_epochs

    @max_epochs.setter
    def max_epochs(self, value: int | None) -> None:
        if value is not None:
            check_count("max_epochs", value, minimum=1, example="max_epochs=10")
        self.limits = attrs.evolve(self.limits, max_epochs=value)

    @property
    def fast_dev_run(self) -> int:
        """Batches of each stage in a debugging run (0: not one)."""
        return self.limits.fast_dev_run

    @property
    def max_steps(self) -> int:
        """Optimizer steps to take (-1: no limit); settable between runs."""
        return self.limits.max_steps

    @max_steps.setter
    def max_steps(self, value: int) -> None:
        check_count("max_steps", value, minimum=-1, example="max_steps=1000 (or -1: no limit)")
        self.limits = attrs.evolve(self.limits, max_steps=value)

    def is_optimizer_step_batch(self, batch_idx: int) -> bool:
        """Whether the batch ``batch_idx`` of this epoch ends with an optimizer step."""
        return is_step_batch(batch_idx, self.accumulate_grad_batches, self.num_training_batches)

    # What a run holds.

    @property
    def attached(self) -> Attached | None:
        """What the run in progress holds in this rank (module, wrapper, optimizers...)."""
        return self._attached

    # The entry points.

    def fit(
        self,
        model: Module,
        train_dataloaders: Iterable[object] | None = None,
        val_dataloaders: Iterable[object] | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: PathLike | None = None,
    ) -> None:
        """Train ``model``; with ``ckpt_path`` (a path, ``"last"`` or ``"best"``), resume.

        A resumed run continues exactly where the checkpoint was taken: the model,
        optimizers, schedulers, precision state, loop position, callbacks and
        random states are restored.

        Raises:
            ConfigurationError: The model or data are missing what fit needs.
            CheckpointError: ``ckpt_path`` is a path that does not exist.
            PeerFailedError: A rank failed; every rank was stopped.
        """
        check_module(model, ("training_step", "configure_optimizers"))
        check_manual_optimization(
            model,
            gradient_clip_val=self.gradient_clip_val,
            accumulate_grad_batches=self.accumulate_grad_batches,
        )
        datamodule = _own_data(model, train_dataloaders, datamodule, "train_dataloader")
        check_data(train_dataloaders, datamodule, "train_dataloader", "fit")
        if datamodule is None and val_dataloaders is None and defines(model, "val_dataloader"):
            # As Lightning: training loaders given, validation from the module's own
            # val_dataloader(), asked for after its setup.
            datamodule = ModuleData(model)
        resolved = self._starting_checkpoint(ckpt_path, "fit")
        self._launch(
            "fit",
            model,
            loaders=train_dataloaders,
            val_loaders=val_dataloaders,
            datamodule=datamodule,
            ckpt_path=resolved,
        )

    def validate(
        self,
        model: Module,
        dataloaders: Iterable[object] | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: PathLike | None = None,
    ) -> list[dict[str, Number]]:
        """Run the validation loop once; returns ``[metrics]`` (folded over ranks when synced)."""
        return self._evaluate_entry("validate", model, dataloaders, datamodule, ckpt_path)

    def test(
        self,
        model: Module,
        dataloaders: Iterable[object] | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: PathLike | None = None,
    ) -> list[dict[str, Number]]:
        """Run the test loop once; returns ``[metrics]`` (folded over ranks when synced)."""
        return self._evaluate_entry("test", model, dataloaders, datamodule, ckpt_path)

    def predict(
        self,
        model: Module,
        dataloaders: Iterable[object] | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: PathLike | None = None,
    ) -> list[object]:
        """Every batch's ``predict_step`` output, in the loader's order (all ranks' together)."""
        check_module(model, ())
        datamodule = _own_data(model, dataloaders, datamodule, "predict_dataloader")
        check_data(dataloaders, datamodule, "predict_dataloader", "predict")
        resolved = self._starting_checkpoint(ckpt_path, "predict")
        result = self._launch(
            "predict",
            model,
            loaders=dataloaders,
            val_loaders=None,
            datamodule=datamodule,
            ckpt_path=resolved,
        )
        assert isinstance(result, list)
        return result

    def _evaluate_entry(
        self,
        stage: Literal["validate", "test"],
        model: Module,
        dataloaders: Iterable[object] | None,
        datamodule: DataModule | None,
        ckpt_path: PathLike | None,
    ) -> list[dict[str, Number]]:
        step = "validation_step" if stage == "validate" else "test_step"
        loader = "val_dataloader" if stage == "validate" else "test_dataloader"
        check_module(model, (step,))
        datamodule = _own_data(model, dataloaders, datamodule, loader)
        check_data(dataloaders, datamodule, loader, stage)
        resolved = self._starting_checkpoint(ckpt_path, stage)
        result = self._launch(
            stage,
            model,
            loaders=dataloaders,
            val_loaders=None,
            datamodule=datamodule,
            ckpt_path=resolved,
        )
        assert isinstance(result, list)
        return result

    # Checks before anything starts.

    def _starting_checkpoint(self, ckpt_path: PathLike | None, stage: Stage) -> str | None:
        return resolve_checkpoint(
            ckpt_path,
            stage,
            strategy=self.strategy,
            callback=self.checkpoint_callback,
            root=self.default_root_dir,
        )

    # Running, in this process or in every rank.

    # One run, in this rank.

    def run_stage(self, module: Module, run: Run) -> object:
        """Set up this rank, run the stage's loop, and tear down, whatever happens."""
        self._launch.begin()
        self.state_stage = run.stage
        module.trainer = self
        self._module = module
        strategy = self.strategy
        try:
            with attach(self, module, run) as attached:
                # The trainer answers for the run from here on (its optimizers, say,
                # to the callbacks that load the checkpoint).
                self._attached = attached
                restore(strategy, attached, run)
                self._launch.ran_as = (strategy.world_size, strategy.global_rank)
                results = self._run_loop(attached, run)
                # Where a fit worked on a copy, the caller's module gets the trained
                # state; every rank decides alike (both ways are collective): a
                # launcher runs every rank on the caller's objects (in each rank's own
                # program), or every rank on copies (spawned).
                if run.stage == "fit" and origin(module) != run.origin:
                    self._launch.hand_back(attached, module)
                return results
        finally:
            # Only the strategy holds the wrapper after this: it releases it (while it
            # still holds its process group) in its teardown.
            self._attached = None
            self._module = None
            module.trainer = None
            strategy.teardown()

    def outcome(self, results: object) -> Outcome:
        """What rank 0 sends back at the end of a run (`plait.trainer.launch.Launch.outcome`)."""
        return self._launch.outcome(results)

    def _run_loop(self, attached: Attached, run: Run) -> object:
        context = LoopContext(
            self.strategy,
            self.progress,
            self.results,
            self.limits,
            self.loop_settings,
            sanity=self._sanity_check,
        )
        return run_stage_loop(
            run,
            attached,
            context,
            checkpointer=self._checkpointer,
            last_checkpoint=None if self.fast_dev_run else self.checkpoint_callback,
        )

    @contextlib.contextmanager
    def _sanity_check(self) -> Iterator[None]:
        self.sanity_checking = True
        try:
            yield
        finally:
            self.sanity_checking = False

    @override
    def __getstate__(self) -> dict[str, object]:
        # The trainer travels to the ranks between runs: nothing of a run goes with it.
        return {**self.__dict__, "_attached": None, "_module": None}

    def save_checkpoint(self, path: PathLike, weights_only: bool = False) -> None:
        """Save the whole run at ``path``, to resume from; every rank must call it.

        With ``weights_only``, the module's state alone (with its hyperparameters and
        where the run stood): for validate, test, predict or a fresh fit, not to
        resume (``fit(ckpt_path=...)`` refuses it).

        Raises:
            ConfigurationError: No run is in progress (a checkpoint is of a running fit).
        """
        attached = self._attached
        if attached is None:
            raise ConfigurationError(
                f"save_checkpoint({os.fspath(path)!r}) was called where no run is in "
                "progress: a checkpoint holds a running fit's module, optimizers and position",
                value=os.fspath(path),
                fix="call it from a callback or hook during fit (ModelCheckpoint does), "
                "or export the module's weights with torch.save(model.state_dict(), path)",
            )
        self._checkpointer.save(attached, path, weights_only=weights_only)

    def load_checkpoint(self, path: PathLike) -> Checkpoint:
        """Read a checkpoint, its tensors on the CPU."""
        return self.strategy.read_checkpoint(path)

    @override
    def __repr__(self) -> str:
        return f"Trainer(strategy={self.strategy!r}, processes={self.num_processes})"


def _own_data(
    model: Module, loaders: object, datamodule: DataModule | None, method: str
) -> DataModule | None:
    """The data module to read: the one given, or the model's own loader methods.

    A Lightning module may define ``train_dataloader()`` and the others itself:
    without loaders or a data module, the model supplies them (`ModuleData`).
    """
    if loaders is None and datamodule is None and defines(model, method):
        return ModuleData(model)
    return datamodule
