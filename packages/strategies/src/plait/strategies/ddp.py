"""DistributedDataParallel: every rank holds the whole model and averages gradients."""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from plait.core import ConfigurationError, TrainingSemantics
from plait.core.errors import suggest
from plait.strategies.parallel import (
    DEFAULT_START_TIMEOUT,
    DEFAULT_TIMEOUT,
    process_group_options,
)
from plait.strategies.self_launching import (
    START_METHODS,
    SelfLaunchingStrategy,
    check_start_method,
    process_launcher,
    processes_per_node,
)
from plait.strategies.state import first_ranks_buffers

if TYPE_CHECKING:
    from plait.core import Accelerator, CheckpointIO, ClusterEnvironment, Precision
    from plait.core.typing import Checkpoint

__all__ = [
    "START_METHODS",
    "DDPStrategy",
    "NamingDistributedDataParallel",
    "SelfLaunchingStrategy",
    "process_launcher",
    "processes_per_node",
]

CommHook = Callable[..., object]
"""A DDP communication hook, e.g. ``default_hooks.fp16_compress_hook`` of
``torch.distributed.algorithms.ddp_comm_hooks``."""


_SET_BY_STRATEGY = ("self", "module", "device_ids", "output_device", "process_group")

_UNUSED = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")


class NamingDistributedDataParallel(DistributedDataParallel):
    """`DistributedDataParallel` that names the parameters a step left without gradients.

    DDP reports such parameters by index, a step late; this names them and says how
    to fix it.
    """

    @override
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; a report of unused parameters names them."""
        try:
            # DDP's forward takes and returns whatever the module does, unannotated.
            return super().forward(*inputs, **kwargs)  # type: ignore[no-untyped-call]
        except RuntimeError as error:
            found = _UNUSED.search(str(error))
            if found is None:
                raise
            trainable = [name for name, p in self.module.named_parameters() if p.requires_grad]
            names = [trainable[int(index)] for index in found.group(1).split()]
            raise ConfigurationError(
                f"the parameters {', '.join(names)} took no part in the previous step's loss, "
                "and DDP was told every parameter would",
                value=names,
                fix="pass find_unused_parameters=True (strategy='ddp_find_unused_parameters_true'),"
                " freeze them (requires_grad=False), or use them in the loss",
            ) from error


def _check_model_averaging(period: object, state: object) -> None:
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ConfigurationError(
            f"model_averaging_period={period!r} must be an int of at least 1",
            value=period,
            fix="average every few steps, e.g. model_averaging_period=4",
        )
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (  # noqa: PLC0415
        PostLocalSGDState,
    )

    if not isinstance(state, PostLocalSGDState):
        raise ConfigurationError(
            "model_averaging_period works with post-local SGD, but ddp_comm_state is "
            f"{type(state).__name__}, not a PostLocalSGDState",
            value=state,
            fix="pass ddp_comm_state=PostLocalSGDState(process_group=None, subgroup=None, "
            "start_localSGD_iter=8) and ddp_comm_hook=post_localSGD_hook",
        )


class DDPStrategy(SelfLaunchingStrategy):
    """Data parallel training with `torch.nn.parallel.DistributedDataParallel`.

    Each rank holds a replica of the module; gradients are averaged across ranks
    during backward. Subclass and override `configure_ddp` to wrap the module your
    own way.

    ``accelerator``, ``parallel_devices``, ``cluster_environment``, ``precision``
    (``precision_plugin``), ``checkpoint_io``, ``process_group_backend``, ``timeout``,
    ``start_timeout`` and ``checked_collectives`` are `ParallelStrategy`'s.

    Args:
        ddp_comm_state: The state passed to ``ddp_comm_hook`` (e.g. a PowerSGD state).
        ddp_comm_hook: A communication hook that replaces DDP's gradient all-reduce,
            e.g. fp16 or bf16 compression, or PowerSGD.
        ddp_comm_wrapper: A wrapper applied to ``ddp_comm_hook``, e.g. ``fp16_compress_wrapper``.
        model_averaging_period: With post-local SGD (``ddp_comm_state`` a
            ``PostLocalSGDState``, ``ddp_comm_hook`` its ``post_localSGD_hook``), average
            the replicas' parameters every this many optimizer steps.
        start_method: How `launcher` starts the processes when no scheduler did:
            ``"popen"`` (run the program again), ``"spawn"``, ``"fork"`` or
            ``"forkserver"``.
        **ddp_kwargs: Passed to `DistributedDataParallel`, e.g. ``static_graph=True``
            or ``find_unused_parameters=True``; checked against its parameters when the
            strategy is made (unless a subclass wraps the module its own way).

    Raises:
        ConfigurationError: A wrapper or state without a hook, a hook that is not
            callable, or a keyword option `DistributedDataParallel` does not take (the
            closest name is suggested).
    """

    def __init__(
        self,
        *,
        accelerator: Accelerator | str | None = None,
        parallel_devices: Sequence[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | str | None = None,
        precision: Precision | str | None = None,
        precision_plugin: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
        ddp_comm_state: object = None,
        ddp_comm_hook: CommHook | None = None,
        ddp_comm_wrapper: Callable[[CommHook], CommHook] | None = None,
        model_averaging_period: int | None = None,
        start_method: str = "popen",
        process_group_backend: str | None = None,
        timeout: timedelta = DEFAULT_TIMEOUT,
        start_timeout: timedelta = DEFAULT_START_TIMEOUT,
        checked_collectives: bool = True,
        **ddp_kwargs: object,
    ) -> None:
        if ddp_comm_hook is None and (ddp_comm_wrapper is not None or ddp_comm_state is not None):
            raise ConfigurationError(
                "ddp_comm_wrapper and ddp_comm_state apply to a ddp_comm_hook, and none was given",
                fix="pass ddp_comm_hook=..., e.g. default_hooks.allreduce_hook",
            )
        if model_averaging_period is not None:
            _check_model_averaging(model_averaging_period, ddp_comm_state)
        check_start_method(start_method)
        self._check_ddp_kwargs(ddp_kwargs)
        if ddp_comm_hook is not None and not callable(ddp_comm_hook):
            raise ConfigurationError(
                f"ddp_comm_hook={ddp_comm_hook!r} is not callable",
                value=ddp_comm_hook,
                fix="pass a hook function from torch.distributed.algorithms.ddp_comm_hooks",
            )
        super().__init__(**process_group_options(locals()))
        self.start_method = start_method
        self.model_averaging_period = model_averaging_period
        self.ddp_comm_state = ddp_comm_state
        self.ddp_comm_hook = ddp_comm_hook
        self.ddp_comm_wrapper = ddp_comm_wrapper
        self.ddp_kwargs = dict(ddp_kwargs)
        # The wrapper whose step runs its own backward passes (manual optimization).
        self._manual: DistributedDataParallel | None = None

    def _check_ddp_kwargs(self, ddp_kwargs: Mapping[str, object]) -> None:
        # A subclass that wraps the module its own way decides what its options mean.
        if type(self).configure_ddp is not DDPStrategy.configure_ddp:
            return
        parameters = inspect.signature(DistributedDataParallel.__init__).parameters
        accepted = [name for name in parameters if name not in _SET_BY_STRATEGY]
        own = [name for name in inspect.signature(DDPStrategy).parameters if name != "ddp_kwargs"]
        for name in ddp_kwargs:
            if name in _SET_BY_STRATEGY:
                raise ConfigurationError(
                    f"DDPStrategy sets DistributedDataParallel's {name} itself",
                    value=name,
                    fix="choose devices with parallel_devices= (or the Trainer's devices=); "
                    "to wrap the module your own way, override configure_ddp",
                )
            if name not in accepted:
                choices = sorted({*own, *accepted})
                raise ConfigurationError(
                    f"DDPStrategy got the option {name}=, which neither it nor "
                    "DistributedDataParallel takes",
                    value=name,
                    choices=choices,
                    suggestion=suggest(name, choices),
                    fix="correct the name; DDPStrategy passes the options it does not take "
                    "itself to DistributedDataParallel",
                )

    @override
    def wrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Wrap ``module`` with `configure_ddp`, then register the communication hook.

        `configure_ddp` may take the module and return the wrapper, or (as in
        Lightning) take nothing, and replace `model` with the wrapper.
        """
        self.model = module
        takes_module = len(inspect.signature(self.configure_ddp).parameters) > 0
        if takes_module:
            wrapped = self.configure_ddp(module)
        else:
            self.configure_ddp()  # type: ignore[call-arg]
            wrapped = self.model
            if wrapped is None:
                raise ConfigurationError(
                    f"{type(self).__qualname__}.configure_ddp() set self.model to None",
                    fix="set self.model to the wrapped module, or take the module and return it",
                )
        if self.model_averaging_period is not None:
            self._default_local_sgd_subgroup()
        if self.ddp_comm_hook is not None and isinstance(wrapped, DistributedDataParallel):
            hook = self.ddp_comm_hook
            if self.ddp_comm_wrapper is not None:
                hook = self.ddp_comm_wrapper(hook)
            wrapped.register_comm_hook(self.ddp_comm_state, hook)
        return wrapped

    @property
    @override
    def training_semantics(self) -> TrainingSemantics:
        """Synchronous replicas; a checkpoint moves to FSDP and DeepSpeed and back.

        A checkpoint resumes at another world size (every rank holds the whole
        state). A resumed run is the run never stopped bit for bit on one rank and on two;
        from three ranks on, within float rounding: DDP adds the ranks' gradients in
        an order that depends on its buckets, which it lays out again after its first
        step, so a resumed run's first step adds them in another order. Each step
        starts from rank 0's buffers (``broadcast_buffers``, unless turned off).
        """
        return TrainingSemantics(
            compatible=("fsdp", "deepspeed"),
            exact_resume=self.world_size <= 2,
            precisions=("32-true", "bf16-mixed"),
            resizable=True,
            buffers="own" if self.ddp_kwargs.get("broadcast_buffers") is False else "broadcast",
        )

    def configure_ddp(self, module: torch.nn.Module) -> torch.nn.Module:
        """Wrap ``module`` in `DistributedDataParallel`; override to wrap it your way."""
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        return NamingDistributedDataParallel(
            module,
            device_ids=device_ids,
            process_group=self.process_group,
            **self.ddp_kwargs,  # type: ignore[arg-type]
        )

    def _default_local_sgd_subgroup(self) -> None:
        # torch's post-local SGD hook makes its default subgroup (the processes of a
        # node) from the CUDA device count, which fails elsewhere: make it here, now
        # that the process group exists, from this node's processes.
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (  # noqa: PLC0415
            PostLocalSGDState,
        )

        state = self.ddp_comm_state
        on_cuda = self.root_device.type == "cuda"
        if isinstance(state, PostLocalSGDState) and state.subgroup is None and not on_cuda:
            per_node = len(self._parallel_devices or ()) or self.world_size
            # new_subgroups is unannotated in torch.
            state.subgroup, _ = torch.distributed.new_subgroups(group_size=per_node)  # type: ignore[no-untyped-call]

    @override
    def setup_optimizers(
        self, optimizers: Sequence[torch.optim.Optimizer]
    ) -> list[torch.optim.Optimizer]:
        """With model averaging, wrap each optimizer so that it averages the replicas."""
        if self.model_averaging_period is None:
            return list(optimizers)
        # Imported here: torch.distributed.optim warns about torch.jit on import.
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (  # noqa: PLC0415
            PostLocalSGDState,
        )
        from torch.distributed.algorithms.model_averaging.averagers import (  # noqa: PLC0415
            PeriodicModelAverager,
        )
        from torch.distributed.optim.post_localSGD_optimizer import (  # noqa: PLC0415
            PostLocalSGDOptimizer,
        )

        assert isinstance(self.ddp_comm_state, PostLocalSGDState)  # checked when made
        warmup = self.ddp_comm_state.start_localSGD_iter
        return [
            PostLocalSGDOptimizer(
                optim=optimizer,
                averager=PeriodicModelAverager(
                    period=self.model_averaging_period,
                    warmup_steps=warmup,
                    process_group=self.process_group,
                ),
            )
            for optimizer in optimizers
        ]

    @override
    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module inside the `DistributedDataParallel` wrapper."""
        inner = module.module if isinstance(module, DistributedDataParallel) else module
        assert isinstance(inner, torch.nn.Module)
        return inner

    @override
    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        """The state of ``module`` and ``optimizers``, with rank 0's buffers on every rank.

        Every rank calls it. The ranks hold the same parameters, but each updates its
        module's buffers (batch norm's running statistics) from its own batches; a
        checkpoint holds one value of each, rank 0's, whether rank 0 writes it alone or
        every rank writes its part (``checkpoint_io="distributed"``).
        """
        state = super().get_state_dict(module, optimizers)
        if not self.is_set_up or self.world_size == 1:
            return state
        module_state = state["state_dict"]
        assert isinstance(module_state, dict)
        group = self.process_group
        state["state_dict"] = first_ranks_buffers(
            self.unwrap_module(module), module_state, [(group, dist.get_global_rank(group, 0))]
        )
        return state

    @override
    def skip_gradient_sync(
        self, module: torch.nn.Module
    ) -> contextlib.AbstractContextManager[None]:
        """`DistributedDataParallel.no_sync`: backward accumulates locally (no all-reduce).

        Raises:
            ConfigurationError: ``module`` is not the wrapper `setup_module` returned
                (the module inside it, or one never set up).
        """
        if isinstance(module, DistributedDataParallel):
            return module.no_sync()
        if self.model is None:
            raise ConfigurationError(
                f"no_sync was given a {type(module).__name__} this strategy never set up: "
                "without the DistributedDataParallel wrapper setup_module puts around it "
                "there is no gradient synchronisation to skip, and the block would do nothing",
                value=module,
                fix="pass the module setup_module (or setup_module_and_optimizers) returned",
            )
        if self.model is module:  # configure_ddp left it unwrapped: nothing reduces
            return contextlib.nullcontext()
        raise ConfigurationError(
            f"no_sync was given the {type(module).__name__} inside the strategy's "
            "DistributedDataParallel wrapper, whose backward would still all-reduce",
            value=module,
            fix="pass the module setup_module (or setup_module_and_optimizers) returned",
        )

    @override
    @contextlib.contextmanager
    def manual_optimization(self, module: torch.nn.Module) -> Iterator[None]:
        """Each backward pass of a step run through ``module`` all-reduces on its own.

        DDP arms its all-reduce at the end of its forward, for the one backward pass
        that follows it. A step that runs its backward passes (any number) inside
        the forward, as a trainer's manual optimization does, is run with that
        turned off, and `backward` arms it for each pass instead (not inside
        `no_sync`, where gradients accumulate locally).

        Raises:
            ConfigurationError: The wrapper was made with ``static_graph=True``,
                which holds DDP to one backward pass per forward.
        """
        if not isinstance(module, DistributedDataParallel):
            yield  # not wrapped (one process): nothing reduces
            return
        if module.static_graph:
            raise ConfigurationError(
                "manual optimization runs the step's own backward passes, and "
                "static_graph=True holds DDP to one backward pass per forward",
                value="static_graph=True",
                fix="drop static_graph=True from the DDPStrategy, or use automatic optimization",
            )
        previous = module.require_backward_grad_sync
        module.require_backward_grad_sync = False
        self._manual = module
        try:
            yield
        finally:
            module.require_backward_grad_sync = previous
            # The forward's end turned buffer broadcasting off (it saw no sync
            # asked): the next forward broadcasts them, as after any training step.
            module.require_forward_param_sync = True
            self._manual = None

    @override
    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None = None) -> None:
        """Compute gradients of ``loss`` (all-reduced, in a step of manual optimization)."""
        wrapper = self._manual
        if wrapper is not None and not self.gradient_sync.depth:
            _arm_all_reduce(wrapper, loss)
        super().backward(loss, module)

    @override
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend={self.process_group_backend!r}, "
            f"{self.size_text()}, device={str(self.root_device)!r})"
        )


def _arm_all_reduce(wrapper: DistributedDataParallel, loss: torch.Tensor) -> None:
    # What DDP's forward does at its end for the backward pass after it: the buckets
    # rebuilt in the order the last pass made gradients (never during a backward),
    # and the reducer told to expect this pass's gradients (with the parameters the
    # loss does not reach marked, when DDP looks for unused ones).
    wrapper.require_forward_param_sync = True
    reducer = wrapper.reducer
    reducer._rebuild_buckets()
    reducer.prepare_for_backward([loss] if wrapper.find_unused_parameters else [])
