"""The Strategy protocol: how a model is spread over processes and devices."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from typing_extensions import Self

from plait.core.protocols.collectives import Collectives

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from contextlib import AbstractContextManager

    import torch
    import torch.distributed
    from torch.distributed.device_mesh import DeviceMesh

    from plait.core.layout import ProcessLayout
    from plait.core.protocols.accelerator import Accelerator
    from plait.core.protocols.checkpoint_io import CheckpointIO
    from plait.core.protocols.launcher import Launcher
    from plait.core.protocols.precision import GradientClipAlgorithm, Precision
    from plait.core.typing import Checkpoint, PathLike

T = TypeVar("T")

__all__ = [
    "RunProgress",
    "Stateful",
    "Strategy",
    "SupportsClosureOptimizers",
    "SupportsLauncher",
    "SupportsLifecycleHooks",
    "SupportsManualOptimization",
    "SupportsModelShardedContext",
    "SupportsNoSync",
    "SupportsProcessDataloader",
    "SupportsReplace",
    "SupportsShardedModule",
]


@runtime_checkable
class Stateful(Protocol):
    """An object a checkpoint can hold the state of: a scheduler, a sampler, a counter."""

    def state_dict(self) -> Mapping[str, object]:
        """Its state."""
        ...

    def load_state_dict(self, state_dict: Mapping[str, object], /) -> object:
        """Take back what `state_dict` returned."""
        ...


@runtime_checkable
class Strategy(Collectives, Protocol):
    """Owns the module and optimizers across processes, and keeps the collective contract.

    The strategy owns every step: a trainer (or a loop of your own) runs the forward
    pass, backward, clipping, the optimizer step and zeroing through it, and takes and
    restores state through it, so that a strategy which shards, casts or wraps does
    so in one place. Usable with or without the Trainer::

        strategy.setup_environment()
        model, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer])
        loss = strategy.training_step(model, batch)
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
        strategy.teardown()
    """

    @property
    def accelerator(self) -> Accelerator:
        """The device kind the strategy runs on."""
        ...

    @property
    def precision(self) -> Precision:
        """The numeric format of the model and its gradients."""
        ...

    @property
    def checkpoint_io(self) -> CheckpointIO:
        """How checkpoints are written and read."""
        ...

    @property
    def root_device(self) -> torch.device:
        """This process's device: where its module and tensors live."""
        ...

    @property
    def world_size(self) -> int:
        """The number of processes in the job."""
        ...

    @property
    def layout(self) -> ProcessLayout:
        """Where this process sits: data is sharded by its data-parallel rank and size."""
        ...

    @property
    def global_rank(self) -> int:
        """This process's rank among all processes."""
        ...

    @property
    def is_global_zero(self) -> bool:
        """Whether this is the process of global rank 0."""
        ...

    def setup_environment(self) -> None:
        """Prepare the device and join the process group (once per process)."""
        ...

    def setup_dataloader(
        self,
        loader: Iterable[T],
        *,
        evaluation: bool = False,
        move_to_device: bool = False,
        use_distributed_sampler: bool = True,
    ) -> Iterable[T]:
        """``loader`` made this rank's: its share of the data, each epoch shuffled anew."""
        ...

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move and wrap ``module`` for this strategy (e.g. in DDP); use what it returns."""
        ...

    def setup_optimizers(
        self, optimizers: Sequence[torch.optim.Optimizer]
    ) -> list[torch.optim.Optimizer]:
        """Prepare ``optimizers`` for this strategy; use what it returns, in the same order."""
        ...

    def setup_module_and_optimizers(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> tuple[torch.nn.Module, list[torch.optim.Optimizer]]:
        """Set up ``module`` and the ``optimizers`` made over its parameters, together.

        Use what it returns: the module as wrapped, and the optimizers in the same
        order (a strategy that replaces parameters, or the optimizers, returns new ones).
        """
        ...

    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module inside any wrapper the strategy added."""
        ...

    def training_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        """Run ``module`` (as set up) on the inputs, for training (through its wrapper)."""
        ...

    def validation_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        """Run ``module`` on the inputs without recording gradients."""
        ...

    def test_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        """Run ``module`` on the inputs without recording gradients."""
        ...

    def predict_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        """Run ``module`` without recording gradients; outputs in the default dtype."""
        ...

    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None = None) -> None:
        """Compute gradients of ``loss`` through the precision plugin."""
        ...

    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> torch.Tensor | None:
        """Clip ``optimizer``'s gradients (unscaled first; by the global norm if sharded).

        Returns:
            By norm, the gradients' total norm before clipping where the strategy
            knows it then; otherwise ``None``.
        """
        ...

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Drop ``optimizer``'s gradients after its step."""
        ...

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], object] | None = None,
    ) -> object:
        """Step ``optimizer`` through the precision plugin."""
        ...

    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        """This rank's ``{"state_dict": ..., "optimizer_states": [...]}`` (every rank calls it)."""
        ...

    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        """Load what `get_state_dict` returned (every rank calls it)."""
        ...

    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Save ``checkpoint`` through the checkpoint IO (every rank calls it).

        Its values may be the live objects: the module, its optimizers, and any
        `Stateful` (their states are taken as `get_state_dict` takes them).
        """
        ...

    def load_checkpoint(
        self,
        path: PathLike,
        state: torch.nn.Module | Mapping[str, object] | None = None,
        *,
        weights_only: bool = False,
    ) -> Checkpoint:
        """Restore the checkpoint at ``path`` into ``state`` in place; what it did not take.

        ``state`` is the module, or a mapping of what `save_checkpoint` was given
        (module, optimizers, `Stateful` objects, plain values); without it, the whole
        checkpoint is returned and nothing is restored. ``weights_only``, or a state
        without optimizers, leaves every optimizer as it was and gives back the run's
        entries alone. Every rank calls it.
        """
        ...

    def read_checkpoint(
        self, path: PathLike, module: torch.nn.Module | None = None, *, weights_only: bool = False
    ) -> Checkpoint:
        """Read the checkpoint at ``path`` without restoring it (for `set_state_dict`).

        With ``module``, a checkpoint IO that loads in place reads the module's
        shards straight into its tensors (and the optimizers', unless
        ``weights_only``). Every rank calls it.
        """
        ...

    def export_checkpoint(self, module: torch.nn.Module, path: PathLike) -> None:
        """Write the module's whole state as one file a plain module loads (every rank calls it)."""
        ...

    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete the checkpoint at ``path``; every rank calls it."""
        ...

    def on_exception(self, exception: BaseException) -> None:
        """React to an exception raised in the user's code (e.g. tell the peers).

        It may raise a clearer error in the exception's place, chained to it (a
        strategy naming the ranks a backend's timeout waited for, say).
        """
        ...

    def no_sync(
        self, module: torch.nn.Module, enabled: bool = True
    ) -> AbstractContextManager[None]:
        """Inside this context, backward passes accumulate gradients without synchronising.

        A no-op where backward does not synchronise; stepping inside it is an error.
        """
        ...

    def teardown(self) -> None:
        """Leave the process group and release devices; safe to call more than once."""
        ...


@runtime_checkable
class SupportsNoSync(Protocol):
    """A strategy that can skip gradient synchronisation (every `Strategy` now can).

    Kept for the code that checks for it; `Strategy.no_sync` is the contract.
    """

    def no_sync(
        self, module: torch.nn.Module, enabled: bool = True
    ) -> AbstractContextManager[None]:
        """Inside this context, backward passes accumulate locally without communicating."""
        ...


@runtime_checkable
class SupportsClosureOptimizers(Protocol):
    """A strategy that says whether it can step an optimizer that calls a closure (LBFGS).

    Such an optimizer evaluates the loss and gradients several times per step and
    decides from them: it needs every parameter and gradient whole on every rank
    (not sharded), and the precision must not scale the loss.
    """

    def check_closure_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Return if ``optimizer`` can be stepped with a closure; else raise, naming why."""
        ...


@runtime_checkable
class SupportsManualOptimization(Protocol):
    """A strategy whose steps may run their own backward passes and optimizer steps.

    A trainer's manual optimization runs the user's whole step (forward, any number
    of backward passes, optimizer steps) through the wrapper's forward; a strategy
    whose wrapper arms gradient synchronisation in its forward (DDP) must arm it at
    each backward instead.
    """

    def manual_optimization(self, module: torch.nn.Module) -> AbstractContextManager[None]:
        """Inside this context, each `backward` through ``module`` synchronises on its own."""
        ...


@runtime_checkable
class SupportsModelShardedContext(Protocol):
    """A strategy that builds models under a context of its own (sharded at creation)."""

    def model_sharded_context(self) -> AbstractContextManager[None]:
        """Inside this context, modules are created as the strategy needs (e.g. on meta)."""
        ...


@runtime_checkable
class SupportsShardedModule(Protocol):
    """A strategy that may leave each rank holding only a share of the module."""

    @property
    def shards_module(self) -> bool:
        """Whether each rank holds only a share of the module's parameters once set up.

        Nothing then gathers the module whole unless asked to (``export_checkpoint``):
        a run in spawned copies of the module hands the caller's module nothing back.
        """
        ...


@runtime_checkable
class SupportsDeviceMesh(Protocol):
    """A strategy whose ranks form a named ``torch.distributed.DeviceMesh``.

    A module parallelizes itself over it (``parallelize_module``, ``fully_shard``),
    reading it from the strategy (the Trainer's ``Module.device_mesh``).
    """

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh, once the strategy has joined its process group."""
        ...


@runtime_checkable
class SupportsContextParallel(Protocol):
    """A strategy that may split every sequence over context-parallel ranks (``cp``).

    The ranks of a ``cp`` group read the same batches; each takes its own tokens
    (`shard_sequence`) and their global positions (`sequence_positions`), and the
    module's attention gathers keys and values over `context_parallel_group`. The
    Trainer's ``Module`` offers the same three, which fall back to the whole sequence
    under any other strategy.
    """

    @property
    def context_parallel_group(self) -> torch.distributed.ProcessGroup | None:
        """This rank's ``cp`` group; ``None`` where the sequence is not split."""
        ...

    def sequence_positions(self, length: int) -> torch.Tensor:
        """The global positions (int64, ascending) of this rank's tokens of a sequence."""
        ...

    def shard_sequence(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of ``tensor`` along ``dim``."""
        ...


@runtime_checkable
class SupportsContextParallelAttention(Protocol):
    """A strategy whose modules' attention may run over sequences split between ``cp`` ranks.

    A module calls `attention` where it would call ``scaled_dot_product_attention``,
    with its own tokens' queries, keys and values (`SupportsContextParallel.shard_sequence`):
    each query attends to the whole sequence's keys, with a causal mask by the
    tokens' global positions. One rank holding the whole sequence: the plain call.
    """

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Attention of this rank's tokens, shaped ``(batch, heads, local_length, head_dim)``."""
        ...


@runtime_checkable
class SupportsPipeline(Protocol):
    """A strategy that may spread a module's layers over pipeline ranks (``pp``).

    `pipeline` cuts a module into stages (named by its submodules) and gives this
    rank's, as a module whose call runs the pipeline schedule's forward and backward
    and returns the loss on every rank; it holds the rank's stages as ``parts`` (a
    ``ModuleList``), each parallelized and sharded over the mesh as the whole module
    would be, before ``setup_module``. The Trainer's ``Module.pipeline`` calls it
    where `pipeline_parallel_size` is more than 1, and keeps the module whole
    otherwise.
    """

    @property
    def pipeline_parallel_size(self) -> int:
        """The ranks a module's stages are spread over (1: no pipeline)."""
        ...

    def pipeline(
        self,
        module: torch.nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        units: Sequence[str] | None = None,
        stages: Sequence[Sequence[str]] | None = None,
    ) -> torch.nn.Module:
        """This rank's stages of ``module``, declared by ``units`` or ``stages``."""
        ...


@runtime_checkable
class PipelineModule(Protocol):
    """A network as a pipeline gives it: called with a batch and ``target=``, the loss.

    What `SupportsPipeline.pipeline` returns (this rank's stages, whose call in
    training runs the schedule's forward and backward), or the network kept whole
    where nothing splits it. ``parts`` are the modules to parallelize (one per stage
    the rank holds, or the network); ``gradient_scale`` multiplies the gradients a
    call back-propagates itself (1 where the caller back-propagates the loss).
    """

    gradient_scale: float

    @property
    def parts(self) -> Iterable[torch.nn.Module]:
        """The modules this rank holds, to parallelize as the whole network would be."""
        ...

    def loss_fn(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss of the network's output and the target."""
        ...


@runtime_checkable
class SupportsAccumulation(Protocol):
    """A strategy told how many batches make one optimizer step.

    The Trainer tells it once per run, before the first batch, when it accumulates
    gradients itself (``accumulate_grad_batches``): a strategy whose modules
    back-propagate inside their own call (a pipeline's schedule, `PipelineModule`)
    divides those gradients by ``batches`` there, as the Trainer divides a loss it
    back-propagates. Nothing else the Trainer does depends on the strategy's family.
    """

    def accumulate(self, module: torch.nn.Module, batches: int) -> None:
        """Each optimizer step of ``module``'s optimizers follows ``batches`` backward passes."""
        ...


@runtime_checkable
class SupportsProcessDataloader(Protocol):
    """A strategy that wraps the loaders it is fed from (a device loader, say)."""

    def process_dataloader(self, loader: Iterable[object]) -> Iterable[object]:
        """What to iterate instead of ``loader`` (already sharded across ranks).

        Called at the start of each pass over ``loader``; the batches it yields may
        already be on the strategy's device.
        """
        ...


@runtime_checkable
class SupportsLauncher(Protocol):
    """A strategy that starts its own processes (or joins externally started ones)."""

    @property
    def launcher(self) -> Launcher:
        """The launcher that runs the job's function on every rank."""
        ...


@runtime_checkable
class SupportsReplace(Protocol):
    """A strategy that can be made again with some of its constructor arguments changed.

    Strategies are not changed after construction: a trainer that must give one a
    precision, a device list or a cluster environment makes a new one with `replace`.
    """

    @property
    def arguments(self) -> Mapping[str, object]:
        """The keyword arguments it was made with (positional ones by their name)."""
        ...

    def accepts(self, argument: str) -> bool:
        """Whether its constructor takes the keyword ``argument``."""
        ...

    def replace(self, **changes: object) -> Self:
        """A new strategy made with `arguments`, ``changes`` replacing or adding to them."""
        ...


@runtime_checkable
class RunProgress(Protocol):
    """What a strategy may read of the run that drives it (the Trainer is one)."""

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        ...

    @property
    def current_epoch(self) -> int:
        """The epoch being run."""
        ...


@runtime_checkable
class SupportsLifecycleHooks(Protocol):
    """A strategy told where a run is: the Trainer calls each hook on every rank.

    ``on_fit_start`` once ``fit`` has set up the module and optimizers (and
    restored a checkpoint), ``on_fit_end`` after its last validation;
    ``on_train_start``/``on_train_end`` around its training loop (a strategy that
    lets replicas drift apart meets them at its end); ``on_validation_start`` and
    ``on_validation_end`` around each validation run (inside ``fit`` and alone); the
    same around ``test`` and ``predict``; then ``teardown``.
    Each does nothing here: a strategy that subclasses this Protocol (as
    `plait.strategies.BaseStrategy` does) overrides the hooks it needs; a loop of your
    own calls the ones its strategy needs.

    Lightning's ``Strategy.setup(trainer)`` is ``on_fit_start(run)`` here: ``setup``
    is the one call that sets up a module and its optimizers.
    """

    def on_fit_start(self, run: RunProgress) -> None:
        """``fit`` is about to train; ``run`` tells its steps and epochs as they go."""
        del run

    def on_fit_end(self) -> None:
        """``fit`` has ended."""
        return

    def on_train_start(self) -> None:
        """Training is about to start (or go on, after a resume)."""
        return

    def on_train_end(self) -> None:
        """Training has ended: its last step is taken."""
        return

    def on_validation_start(self) -> None:
        """A validation run is about to start."""
        return

    def on_validation_end(self) -> None:
        """A validation run has ended."""
        return

    def on_test_start(self) -> None:
        """A test run is about to start."""
        return

    def on_test_end(self) -> None:
        """A test run has ended."""
        return

    def on_predict_start(self) -> None:
        """A predict run is about to start."""
        return

    def on_predict_end(self) -> None:
        """A predict run has ended."""
        return
