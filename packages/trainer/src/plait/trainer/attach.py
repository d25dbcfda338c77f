"""One run in one rank: the module and optimizers set up by the strategy, and always torn down."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from plait.core import (
    ConfigurationError,
    SupportsModelShardedContext,
    SupportsShardedModule,
    rank_zero_info,
    rank_zero_warn,
)
from plait.trainer.checkpointing import check_checkpoint, from_lightning
from plait.trainer.hooks import Hooks
from plait.trainer.hparams import saved
from plait.trainer.loggers import SupportsConnect, SupportsLogGraph
from plait.trainer.module import ModuleData, overrides
from plait.trainer.optim import parse_optimizers
from plait.trainer.optimization import TrainerOptimizer, check_closure_optimizers
from plait.trainer.run_state import Attached, Run, steps_of

if TYPE_CHECKING:
    from plait.core import Strategy
    from plait.trainer.module import DataModule, Module
    from plait.trainer.trainer import Trainer

__all__ = ["attach", "restore"]


@contextlib.contextmanager
def attach(trainer: Trainer, module: Module, run: Run) -> Iterator[Attached]:
    """Set this rank up for ``run``, yield what it holds, and tear down, whatever happens.

    Set-up: the strategy's environment, the data module, the callbacks' ``setup``,
    the loggers (rank 0: connected, then given the hyperparameters),
    ``configure_model`` (in the strategy's sharded context), the optimizers, and the
    module and optimizers through the strategy; `restore` then loads the run's
    checkpoint into them. Teardown: the callbacks' and the module's ``teardown``,
    the profiler, the loggers (rank 0). A failure goes to the callbacks'
    ``on_exception`` and to the strategy, which may raise a clearer error. The
    trainer (already the module's) tears the strategy down itself, once it has let
    go of what it holds.
    """
    strategy = trainer.strategy
    stage, datamodule = run.stage, run.datamodule
    hooks = Hooks(trainer, module, trainer.callbacks, trainer.profiler)
    status = "failed"
    try:
        strategy.setup_environment()
        trainer.profiler.start(
            stage, os.path.join(trainer.default_root_dir, "profiles"), strategy.global_rank
        )
        trainer.torch_flags.apply()
        if datamodule is not None and not isinstance(datamodule, ModuleData):
            datamodule.trainer = trainer
            if strategy.is_global_zero:
                datamodule.prepare_data()
            strategy.barrier("prepare_data")
            datamodule.setup(stage)
        # The module's own hooks, whatever supplies the data (Lightning's order).
        if overrides(module, "prepare_data"):
            if strategy.is_global_zero:
                module.prepare_data()
            strategy.barrier("module prepare_data")
        module.setup(stage)
        hooks.setup(stage)
        # On every rank, so that a clash is refused alike everywhere.
        params = logged_hyperparameters(module, datamodule)
        if strategy.is_global_zero:
            _start_loggers(trainer, params)
        attached = _set_up(trainer, module, run, hooks)
        if strategy.is_global_zero:
            _log_graphs(trainer, attached)
        yield attached
        status = "success"
    except BaseException as error:
        hooks.on_exception(error)
        # The strategy may raise a clearer error in its place (naming the ranks
        # a timed-out collective waited for, say).
        strategy.on_exception(error)
        raise
    finally:
        hooks.teardown(stage)
        module.teardown(stage)
        # The layers synchronised at set-up are plain again, as the module was given.
        trainer.torch_flags.revert(module, strategy.world_size)
        report = trainer.profiler.stop()
        if report is not None:
            rank_zero_info(f"profile of {stage}: {report} (one per rank)")
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.finalize(status)
        trainer.results.end_run()


def _start_loggers(trainer: Trainer, params: dict[str, object]) -> None:
    for logger in trainer.loggers:
        # A logger's service unreachable or refused: said before training.
        if isinstance(logger, SupportsConnect):
            logger.connect()
        if params:
            logger.log_hyperparams(params)


def logged_hyperparameters(module: Module, datamodule: DataModule | None) -> dict[str, object]:
    """The module's and the data module's hyperparameters, as the loggers get them.

    Raises:
        ConfigurationError: Both hold a name, with different values.
    """
    params = saved(module.hparams) if module.logs_hyperparameters else {}
    if datamodule is None or isinstance(datamodule, ModuleData):
        return params
    data = saved(datamodule.hparams) if datamodule.logs_hyperparameters else {}
    clashing = sorted(name for name in set(params) & set(data) if params[name] != data[name])
    if clashing:
        raise ConfigurationError(
            f"the module and the data module both save the hyperparameter(s) {clashing}, "
            "with different values: the loggers would get one of them",
            value=clashing,
            fix="rename one, or leave it out of one with save_hyperparameters(ignore=[...])",
        )
    return {**params, **data}


def _log_graphs(trainer: Trainer, attached: Attached) -> None:
    """Give the set-up module to the loggers that record its graph (rank 0 alone)."""
    graphing = [logger for logger in trainer.loggers if isinstance(logger, SupportsLogGraph)]
    if not graphing:
        return
    strategy = trainer.strategy
    if isinstance(strategy, SupportsShardedModule) and strategy.shards_module:
        # A trace on rank 0 alone would gather the shards without the other ranks.
        rank_zero_warn(
            f"the module's graph is not logged: {type(strategy).__name__} shards it "
            "over the ranks, and tracing it on rank 0 alone would wait for the others"
        )
        return
    module = attached.module
    training = module.training
    # In eval mode: a layer that meets the other ranks in training (SyncBatchNorm)
    # computes alone from its running statistics.
    module.eval()
    try:
        with torch.no_grad():
            for logger in graphing:
                logger.log_graph(module)
    finally:
        module.train(training)


def _set_up(trainer: Trainer, module: Module, run: Run, hooks: Hooks) -> Attached:
    strategy = trainer.strategy
    stage = run.stage
    # Layers made here may be created on the meta device (a sharding strategy's
    # context), to be materialised shard by shard at set-up.
    context = (
        strategy.model_sharded_context()
        if isinstance(strategy, SupportsModelShardedContext)
        else contextlib.nullcontext()
    )
    with context:
        module.configure_model()
    # In place (the root is the user's module): each BatchNorm becomes a SyncBatchNorm
    # holding the same parameters, before the strategy wraps the module.
    trainer.torch_flags.prepare(module, strategy.world_size)
    if trainer.compile_options is not None:
        # In place (the module keeps its parameters' names), once its layers exist,
        # before the strategy wraps or shards it (as torchtitan compiles, then shards).
        module.compile(**trainer.compile_options)
    optimizers, schedulers = (
        parse_optimizers(module.configure_optimizers()) if stage == "fit" else ([], [])
    )
    # Before set-up: a strategy that shards would otherwise shard first.
    check_closure_optimizers(
        strategy,
        optimizers,
        automatic=module.automatic_optimization,
        accumulate=trainer.accumulate_grad_batches,
    )
    # Module and optimizers are set up in one call: a strategy may need both at
    # once (DeepSpeed), or replace the parameters the optimizers hold (sharding).
    steps = steps_of(module)
    wrapped, prepared = strategy.setup_module_and_optimizers(steps, optimizers)
    for config in schedulers:
        # The strategy may stand a twin in for an optimizer (sharding, averaging):
        # the scheduler must drive the twin.
        config.scheduler.optimizer = prepared[
            [id(o) for o in optimizers].index(id(config.optimizer))
        ]
    return Attached(
        module=module,
        steps=steps,
        wrapped=wrapped,
        optimizers=prepared,
        schedulers=schedulers,
        hooks=hooks,
        handles=[
            TrainerOptimizer(
                optimizer,
                parameter_names=_names_of(module, optimizer),
                strategy=strategy,
                wrapped=wrapped,
                module=module,
                hooks=hooks,
                progress=trainer.progress,
            )
            for optimizer in prepared
        ],
        checkpoint=None,
        datamodule=None if isinstance(run.datamodule, ModuleData) else run.datamodule,
    )


def restore(strategy: Strategy, attached: Attached, run: Run) -> None:
    """Load the checkpoint ``run`` starts from, if any, into what ``attached`` holds.

    Read after set-up: a checkpoint IO that loads in place fills the module's own
    (possibly sharded) tensors, each rank reading only what it holds. The callbacks
    see it first (``on_load_checkpoint``), when the trainer already answers for the
    run (its optimizers, say).
    """
    if not run.ckpt_path:
        return
    module = attached.module
    checkpoint = from_lightning(strategy.read_checkpoint(run.ckpt_path, module))
    check_checkpoint(checkpoint, run.ckpt_path, run.stage)
    attached.hooks.on_load_checkpoint(checkpoint)
    optimizers = attached.optimizers if run.stage == "fit" else []
    strategy.set_state_dict(module, optimizers, checkpoint, source=run.ckpt_path)
    attached.checkpoint = checkpoint


def _names_of(module: Module, optimizer: torch.optim.Optimizer) -> frozenset[str]:
    # Taken at set-up, when the module holds the parameters the optimizer holds (a
    # sharded module holds gathered copies inside its forward: named alike).
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return frozenset(name for name, p in module.named_parameters() if id(p) in held)
