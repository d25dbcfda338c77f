"""What every strategy shares: its parts, the module's set-up, and checkpoints."""

from __future__ import annotations

import abc
import contextlib
import gc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar, overload

import torch

from plait.core import (
    Accelerator,
    CheckpointIO,
    Collectives,
    ConfigurationError,
    GradientClipAlgorithm,
    Precision,
    ProcessLayout,
    publish_rank,
)
from plait.strategies.checkpoints import Checkpoints
from plait.strategies.data import DistributedLoader, setup_dataloader
from plait.strategies.gradient_sync import GradientSync, refuse_closure_optimizer
from plait.strategies.lifecycle import Lifecycle
from plait.strategies.lightning_calls import LightningCalls
from plait.strategies.parts import one_precision, resolve_parts
from plait.strategies.rebind import rebind_optimizers, replaced_parameters
from plait.strategies.remake import Remakeable
from plait.strategies.state import (
    load_module_state,
    module_state_of,
    optimizer_parameter_names,
    optimizer_state_keyed,
    optimizer_states_of,
)

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, Group, PathLike, ReduceOpLike, StateDict

__all__ = ["BaseStrategy"]

T = TypeVar("T")


class BaseStrategy(LightningCalls, Lifecycle, Remakeable, abc.ABC):
    """A strategy built from an accelerator, a precision and a checkpoint IO.

    Each part is passed in, or made by name from the core registries: the
    accelerator of the strategy's device, ``"32-true"`` precision and ``"torch"``
    checkpoint IO. Subclasses say how many processes there are, which device is
    this process's, how the module is wrapped, and how the collectives run.

    A strategy works the same in the Trainer and in a loop of your own::

        strategy.setup_environment()
        model, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer])
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer)
        strategy.teardown()

    A strategy remembers the arguments it was made with (`arguments`): it pickles
    as them, so that a rank in another process makes it anew and finds its own
    place, and `replace` makes a copy with some of them changed.
    """

    _model: torch.nn.Module | None = None

    def __init__(
        self,
        *,
        accelerator: Accelerator | str | None = None,
        precision: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
        precision_plugin: Precision | str | None = None,
    ) -> None:
        parts = resolve_parts(
            self,
            device_type=self.default_device_type(),
            accelerator=accelerator,
            precision=one_precision(precision, precision_plugin),
            checkpoint_io=checkpoint_io,
        )
        self._accelerator = parts.accelerator
        self._precision = parts.precision
        self._checkpoint_io = parts.checkpoint_io
        self._checkpoints = Checkpoints(self)
        self._gradient_sync = GradientSync(self)
        self._replaced_parameters: dict[int, torch.nn.Parameter] = {}

    # The parts.

    @property
    def accelerator(self) -> Accelerator:
        """The device kind the strategy runs on.

        Assignable before the strategy is set up, as in Lightning (`assign_part`).
        """
        return self._accelerator

    @accelerator.setter
    def accelerator(self, accelerator: Accelerator | str) -> None:
        self.assign_part("accelerator", accelerator)

    @property
    def precision(self) -> Precision:
        """The numeric format of the model and its gradients (assignable, `assign_part`)."""
        return self._precision

    @precision.setter
    def precision(self, precision: Precision | str) -> None:
        self.assign_part("precision", precision)

    @property
    def checkpoint_io(self) -> CheckpointIO:
        """How checkpoints are written and read (assignable, `assign_part`)."""
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, checkpoint_io: CheckpointIO | str) -> None:
        self.assign_part("checkpoint_io", checkpoint_io)

    @property
    def is_set_up(self) -> bool:
        """Whether a module has been set up (a parallel strategy: or its group joined)."""
        return self._model is not None

    @property
    def shards_at_creation(self) -> bool:
        """Whether the module is sharded as it is made (its own `model_sharded_context`)."""
        return type(self).model_sharded_context is not BaseStrategy.model_sharded_context

    @property
    def loads_as_torch(self) -> bool:
        """Whether a module's state loads as PyTorch loads it: whole, by the module's own method."""
        return type(self).set_state_dict is BaseStrategy.set_state_dict and not self.shards_module

    @property
    def checkpoints(self) -> Checkpoints:
        """The strategy's checkpoints: what `save_checkpoint` and its kin delegate to."""
        return self._checkpoints

    @property
    def model(self) -> torch.nn.Module | None:
        """The module as `setup_module` returned it (wrapped); ``None`` before and after."""
        return self._model

    @model.setter
    def model(self, module: torch.nn.Module | None) -> None:
        self._model = module

    @property
    def layout(self) -> ProcessLayout:
        """Where this process sits: the world, and its data-parallel rank and size.

        One process by default; parallel strategies fill it from their group.
        """
        return ProcessLayout.single_process()

    # Where this process is.

    @abc.abstractmethod
    def default_device_type(self) -> str:
        """The device type used to choose default parts, e.g. ``"cpu"``."""

    @property
    @abc.abstractmethod
    def root_device(self) -> torch.device:
        """This process's device."""

    @property
    @abc.abstractmethod
    def world_size(self) -> int:
        """The number of processes in the job."""

    @property
    @abc.abstractmethod
    def global_rank(self) -> int:
        """This process's rank among all processes."""

    @property
    @abc.abstractmethod
    def collectives(self) -> Collectives:
        """The collectives of this process's job (the contract of `plait.core`)."""

    @property
    def is_global_zero(self) -> bool:
        """Whether this is the process of global rank 0."""
        return self.global_rank == 0

    # The collective contract, kept by `collectives`.

    @overload
    def reduce(
        self, value: torch.Tensor, group: Group | None = None, reduce_op: ReduceOpLike = "mean"
    ) -> torch.Tensor: ...

    @overload
    def reduce(
        self, value: float, group: Group | None = None, reduce_op: ReduceOpLike = "mean"
    ) -> float: ...

    def reduce(
        self,
        value: torch.Tensor | float,
        group: Group | None = None,
        reduce_op: ReduceOpLike = "mean",
    ) -> torch.Tensor | float:
        """Reduce over every rank (of ``group``), out of place; the mean of integers is floating.

        ``group`` is a process group or the name of a dimension of `layout`.
        """
        return self.collectives.reduce(value, group, reduce_op)

    def broadcast(self, obj: T, src: int = 0, group: Group | None = None) -> T:
        """Give every rank (of ``group``) a value equal to global rank ``src``'s ``obj``."""
        return self.collectives.broadcast(obj, src, group)

    def barrier(
        self,
        name: str | None = None,
        timeout: timedelta | float | None = None,
        group: Group | None = None,
    ) -> None:
        """Wait until every rank (of ``group``) has entered; on timeout, name the missing."""
        self.collectives.barrier(name, timeout, group)

    def all_gather(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        """Stack every rank's ``tensor`` (of ``group``): rows in rank order."""
        return self.collectives.all_gather(tensor, group)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002
        """Whether ``decision`` holds on every rank (``all``) or on any rank."""
        return self.collectives.reduce_boolean_decision(decision, all)

    # Set-up.

    def setup_environment(self) -> None:
        """Make this process's device current (parallel strategies also join the group).

        It also gives this process's rank to libraries that keep one of their own
        (`plait.core.publish_rank`).
        """
        publish_rank(self.global_rank)
        self.accelerator.setup_device(self.root_device)

    def model_to_device(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move ``module``'s parameters and buffers to this process's device."""
        return module.to(self.root_device)

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert ``module`` for the precision, move it to the device, and wrap it.

        Use the returned module for the forward pass; it may be a wrapper of yours.
        """
        before = list(module.parameters())
        module = self.precision.convert_module(module)
        module = self.model_to_device(module)
        self._replaced_parameters = replaced_parameters(before, list(module.parameters()))
        self._model = self.wrap_module(module)
        return self._model

    def wrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Wrap the module for this strategy (DDP, FSDP, ...); unwrapped by default."""
        return module

    def setup_optimizers(
        self, optimizers: Sequence[torch.optim.Optimizer]
    ) -> list[torch.optim.Optimizer]:
        """Prepare ``optimizers`` (made over the module's parameters, before or after set-up).

        Where moving the module made new parameter objects (on XLA devices), an
        optimizer made before `setup_module` is pointed at them, with its state.
        """
        rebind_optimizers(optimizers, self._replaced_parameters)
        return list(optimizers)

    def setup_module_and_optimizers(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> tuple[torch.nn.Module, list[torch.optim.Optimizer]]:
        """`setup_module`, then `setup_optimizers`, with a check that they belong together.

        Raises:
            ConfigurationError: An optimizer holds parameters that are not the
                module's (for instance, made from another copy of the model).
        """
        self.check_optimizers_belong(module, optimizers)
        wrapped = self.setup_module(module)
        return wrapped, self.setup_optimizers(optimizers)

    @staticmethod
    def check_optimizers_belong(
        module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> None:
        """Refuse an optimizer that holds parameters ``module`` does not have.

        Raises:
            ConfigurationError: Naming the optimizer (made from another copy of the
                model, say).
        """
        parameters = {id(parameter) for parameter in module.parameters()}
        for index, optimizer in enumerate(optimizers):
            for group in optimizer.param_groups:
                if any(id(parameter) not in parameters for parameter in group["params"]):
                    raise ConfigurationError(
                        f"optimizer {index} holds parameters that are not the module's",
                        value=optimizer,
                        fix="make the optimizer from module.parameters() of this module",
                    )

    @contextlib.contextmanager
    def model_sharded_context(self) -> Iterator[None]:
        """The context to create the model in (sharding strategies shard it at creation)."""
        yield

    def module_state_fitted(
        self, module: torch.nn.Module, state_dict: Mapping[str, object]
    ) -> dict[str, object]:
        """The module's own whole state, with ``state_dict``'s keys the module has put over it.

        What a non-strict load loads: the module's parameters the state lacks keep
        their values, the state's keys the module lacks are dropped. A sharding
        strategy's own state is gathered whole (`full_module_state`).
        """
        own: Mapping[str, object] = (
            self.full_module_state(module) if self.shards_module else self.module_state_dict(module)
        )
        return {**own, **{key: value for key, value in state_dict.items() if key in own}}

    # Steps.

    def training_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        """Run ``module`` (as `setup_module` returned it) on inputs, for training.

        Inputs are converted for the precision and the forward pass runs in its
        context; through a DDP wrapper, this is what makes the backward pass sync.
        """
        return self._forward(module, args, kwargs)

    def validation_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        """Run ``module`` on inputs without recording gradients."""
        with torch.no_grad():
            return self._forward(module, args, kwargs)

    def test_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        """Run ``module`` on inputs without recording gradients."""
        with torch.no_grad():
            return self._forward(module, args, kwargs)

    def predict_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        """Run ``module`` on inputs without recording gradients; outputs in the default dtype."""
        with torch.no_grad():
            return self.precision.convert_output(self._forward(module, args, kwargs))

    def _forward(
        self, module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> object:
        precision = self._precision
        args = precision.convert_input(args)
        if kwargs:
            kwargs = precision.convert_input(kwargs)
        context = precision.forward_context()
        if type(context) is contextlib.nullcontext:  # nothing to enter: the usual step
            return module(*args, **kwargs)
        with context:
            return module(*args, **kwargs)

    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None = None) -> None:
        """Compute gradients of ``loss`` through the precision plugin."""
        self._precision.backward(loss, module)

    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> torch.Tensor | None:
        """Clip ``optimizer``'s gradients through the precision plugin (unscaled first).

        A strategy whose gradients are sharded overrides it to clip by the global norm.

        Returns:
            By norm, the gradients' total norm before clipping (what the precision
            plugin returned); ``None`` by value, or with ``clip_val`` 0.
        """
        return self.precision.clip_gradients(module, optimizer, clip_val, algorithm)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Drop ``optimizer``'s gradients (set to ``None``) after its step."""
        optimizer.zero_grad(set_to_none=True)

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], object] | None = None,
    ) -> object:
        """Step ``optimizer`` through the precision plugin.

        Raises:
            ConfigurationError: Called inside `no_sync`.
        """
        if self._gradient_sync.depth:  # read here: the check's call is paid when it raises
            self.check_not_accumulating()
        return self._precision.optimizer_step(optimizer, closure)

    # Data.

    def setup_dataloader(
        self,
        loader: Iterable[T],
        *,
        evaluation: bool = False,
        move_to_device: bool = False,
        use_distributed_sampler: bool = True,
    ) -> DistributedLoader[T]:
        """``loader`` made this rank's, for a loop of your own.

        A `DataLoader` with the default sampler is rebuilt with a `DistributedSampler`
        over the data-parallel ranks (`layout`), shuffled as ``shuffle`` asked, from
        the global seed (`seed_everything`), ``drop_last`` kept. Each pass over the
        result is an epoch, told to the sampler first. Save the result with the run
        (it is `Stateful`: its epoch) to shuffle a resumed run as the first.

        Args:
            loader: A `DataLoader` (or, with ``use_distributed_sampler=False``, any
                iterable of batches this rank should read).
            evaluation: Give each sample to exactly one rank, in order, none repeated
                (for metrics), instead of a shuffled training sampler.
            move_to_device: Yield batches on `root_device` (a strategy with a device
                loader of its own, XLA's, always does).
            use_distributed_sampler: Rebuild the sampler. ``False`` keeps ``loader``
                as it is, for data you shard yourself.

        Raises:
            ConfigurationError: With more than one data-parallel rank, a loader that
                cannot be given a `DistributedSampler` (a sampler of its own, an
                iterable dataset, not a `DataLoader`): every rank would read all of it.
        """
        return setup_dataloader(
            self,
            loader,
            evaluation=evaluation,
            move_to_device=move_to_device,
            use_distributed_sampler=use_distributed_sampler,
        )

    # When gradients are synchronised (`GradientSync`).

    @property
    def gradient_sync(self) -> GradientSync:
        """When gradients are synchronised: what `no_sync` and its kin delegate to."""
        return self._gradient_sync

    refuse_closure_optimizer = staticmethod(refuse_closure_optimizer)

    def check_closure_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse to step ``optimizer`` with a closure where it cannot work (`GradientSync`)."""
        self._gradient_sync.check_closure_optimizer(optimizer)

    def manual_optimization(self, module: torch.nn.Module) -> AbstractContextManager[None]:
        """Inside, a step through ``module`` runs its own backward passes (`GradientSync`)."""
        return self._gradient_sync.manual_optimization(module)

    def no_sync(
        self, module: torch.nn.Module, enabled: bool = True
    ) -> AbstractContextManager[None]:
        """Backward passes inside accumulate without synchronising (`GradientSync.no_sync`)."""
        return self._gradient_sync.no_sync(module, enabled)

    def skip_gradient_sync(self, module: torch.nn.Module) -> AbstractContextManager[None]:
        """The context that stops ``module``'s backward from synchronising gradients.

        Nothing by default (there is nothing to skip); a strategy whose backward
        communicates (DDP, FSDP) returns its library's own context.
        """
        del module
        return contextlib.nullcontext()

    def check_not_accumulating(self) -> None:
        """Refuse to step while a `no_sync` block is open (`GradientSync`)."""
        self._gradient_sync.check_not_accumulating()

    # State.

    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside any wrapper `wrap_module` added."""
        return module

    def module_state_dict(self, module: torch.nn.Module) -> StateDict:
        """The state of the user's module, without wrapper prefixes."""
        return self.unwrap_module(module).state_dict()

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> StateDict:
        """The state of ``optimizer``."""
        return optimizer.state_dict()

    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        """This rank's share of the state of ``module`` and ``optimizers``.

        Every rank calls it (a sharding strategy may gather). ``module`` is the user's
        module, inside or outside the strategy's wrapper.

        Returns:
            ``{"state_dict": ..., "optimizer_states": [...], "precision": ...}``, the
            keys of a checkpoint.
        """
        return {
            "state_dict": self.module_state_dict(module),
            "optimizer_states": [self.optimizer_state_dict(o) for o in optimizers],
            "precision": self.precision.state_dict(),
        }

    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        """Load what `get_state_dict` returned into ``module`` and ``optimizers``.

        Every rank calls it. Optimizer and precision states are loaded only when
        optimizers are given (to go on training).

        Raises:
            CheckpointError: The state does not fit the module (each key that differs
                is named), or holds another number of optimizer states.
        """
        module_state = module_state_of(state, source)
        load_module_state(self.unwrap_module(module), module_state, source)
        if not optimizers:
            return
        saved = optimizer_states_of(state, len(optimizers), source)
        inner = self.unwrap_module(module)
        for optimizer, optimizer_state in zip(optimizers, saved, strict=True):
            names = optimizer_parameter_names(inner, optimizer)
            # FSDP's states are keyed by parameter name; torch's optimizers take indices.
            optimizer.load_state_dict(
                optimizer_state_keyed(optimizer_state, names, by_name=False, source=source)
            )
        precision_state = state.get("precision")
        self.precision.load_state_dict(
            dict(precision_state) if isinstance(precision_state, Mapping) else {}
        )

    @property
    def shards_module(self) -> bool:
        """Whether each rank holds only a share of the module's parameters: here not.

        See `plait.core.SupportsShardedModule`; every rank holds the module whole.
        """
        return False

    def full_module_state(self, module: torch.nn.Module) -> StateDict:
        """The module's whole state, on the CPU, with the user module's keys.

        Every rank calls it: a sharding strategy gathers the shards (to rank 0 alone
        where it can; other ranks may get an empty mapping). Nothing else in plait
        gathers a sharded module whole: this is the one call that does, on demand.
        """
        return {key: value.detach().cpu() for key, value in self.module_state_dict(module).items()}

    def export_checkpoint(self, module: torch.nn.Module, path: PathLike) -> None:
        """Write the module's whole state as one file plain PyTorch loads (`Checkpoints.export`)."""
        self._checkpoints.export(module, path)

    @property
    def writes_collectively(self) -> bool:
        """Whether every rank saves, loads and removes checkpoints (`Checkpoints.collective`)."""
        return self._checkpoints.collective

    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Write ``checkpoint`` (live objects or plain entries) at ``path`` (`Checkpoints.save`).

        Fabric's order, ``save_checkpoint(path, state)``, is taken too at run time (a
        path is never a checkpoint, so the two cannot be confused).
        """
        self._checkpoints.save(checkpoint, path)

    def load_checkpoint(
        self,
        path: PathLike,
        state: torch.nn.Module | Mapping[str, object] | None = None,
        *,
        weights_only: bool = False,
        strict: bool = True,
    ) -> Checkpoint:
        """Restore the checkpoint at ``path`` into ``state``, in place (`Checkpoints.load`)."""
        return self._checkpoints.load(path, state, weights_only=weights_only, strict=strict)

    def read_checkpoint(
        self, path: PathLike, module: torch.nn.Module | None = None, *, weights_only: bool = False
    ) -> Checkpoint:
        """Read the checkpoint at ``path`` without restoring it, on the CPU (`Checkpoints.read`)."""
        return self._checkpoints.read(path, module, weights_only=weights_only)

    def read_in_place(
        self,
        path: PathLike,
        module: torch.nn.Module | None,
        *,
        weights_only: bool,
        recognized: bool,
    ) -> Checkpoint | None:
        """A checkpoint of the IO's own format read this strategy's way: none by default.

        `Checkpoints.read` asks it once per read, after detecting the format; ``None``
        reads through the checkpoint IO.
        """
        del path, module, weights_only, recognized
        return None

    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete the checkpoint at ``path`` (`Checkpoints.remove`)."""
        self._checkpoints.remove(path)

    # The end.

    def on_exception(self, exception: BaseException) -> None:
        """React to an exception in the user's code; nothing by default."""

    def teardown(self) -> None:
        """Forget the module, finish pending checkpoint writes and release the device."""
        self._release_model()
        self.checkpoint_io.teardown()
        self.accelerator.teardown()

    def _release_model(self) -> None:
        # A wrapper (DDP's reducer) must die while the strategy still holds its
        # process group: destroyed from the reducer's side, a gloo group joins its
        # worker threads with the GIL held, and deadlocks if one of them is about to
        # free a tensor of the last collective (which takes the GIL). A collection
        # (a tenth of a second) is needed only where the strategy made a wrapper.
        model, self._model = self._model, None
        self._replaced_parameters = {}
        if model is not None and self.unwrap_module(model) is not model:
            del model
            gc.collect()
