"""`DeepSpeedStrategy`: ZeRO stages 0-3 and CPU offload, through DeepSpeed's engine."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Final, cast

import torch
from typing_extensions import override

from plait.core import (
    CheckpointError,
    ConfigurationError,
    GradientClipAlgorithm,
    TrainingSemantics,
)
from plait.strategies.deepspeed import library
from plait.strategies.deepspeed.checkpoint_io import DeepSpeedCheckpointIO
from plait.strategies.deepspeed.config import (
    KNOWN_KEYS,
    STAGES,
    Offload,
    check_keys,
    check_supported,
    config_precision,
    config_stage,
    declared_keys,
    derive_config,
    merge_config,
    offload_device,
    offloads,
    precision_name,
    read_config,
    sized_buckets,
)
from plait.strategies.deepspeed.export import checkpoint_layout
from plait.strategies.deepspeed.whole_state import (
    is_partitioned,
    set_master_weights,
    set_optimizer_state,
)
from plait.strategies.export import read_whole
from plait.strategies.norms import BATCH_NORMS
from plait.strategies.parallel import DEFAULT_START_TIMEOUT, DEFAULT_TIMEOUT, process_group_options
from plait.strategies.self_launching import SelfLaunchingStrategy, check_start_method
from plait.strategies.state import (
    load_module_state,
    module_state_of,
    optimizer_state_keyed,
    optimizer_states_of,
    parameter_names,
)

if TYPE_CHECKING:
    from plait.core import Accelerator, CheckpointIO, ClusterEnvironment, Precision
    from plait.core.typing import Checkpoint, PathLike, StateDict
    from plait.strategies.deepspeed.engine import Engine

__all__ = ["CONFIG_PATH_VARIABLE", "DeepSpeedStrategy"]

CONFIG_PATH_VARIABLE: Final = "PL_DEEPSPEED_CONFIG_PATH"
"""Read for ``config`` when none is given: the JSON file Lightning's variable names."""

_PARTITIONED_BY = "_plait_partitioned_by"
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _statistics_in(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Batch norm's running statistics in ``dtype``, the dtype DeepSpeed casts its weights to.

    The engine casts parameters alone: a norm layer's bfloat16 weights beside its
    float32 running statistics fail its first forward.
    """
    for norm in module.modules():
        if not isinstance(norm, BATCH_NORMS):
            continue
        for name, buffer in norm.named_buffers(recurse=False):
            if buffer.is_floating_point() and buffer.dtype != dtype:
                setattr(norm, name, buffer.to(dtype))


def _cast_floating(data: object, dtype: torch.dtype) -> object:
    if isinstance(data, torch.Tensor):
        return data.to(dtype) if data.is_floating_point() else data
    if isinstance(data, list):
        return [_cast_floating(item, dtype) for item in data]
    if isinstance(data, tuple):
        items = [_cast_floating(item, dtype) for item in data]
        if hasattr(data, "_fields"):  # a named tuple
            maker: Callable[..., object] = type(data)
            return maker(*items)
        return tuple(items)
    if isinstance(data, Mapping):
        return {key: _cast_floating(value, dtype) for key, value in data.items()}
    return data


def _check_device_indices(devices: Sequence[torch.device] | None) -> None:
    """Refuse devices other than those of the local ranks: DeepSpeed's engine takes those.

    The engine puts each process on the device numbered by its local rank, whatever
    device the strategy was given (Lightning refuses the same).

    Raises:
        ConfigurationError: A device index is not its process's local rank.
    """
    # torch types an index as an int; a device made without one (cpu, "cuda") has None.
    given: list[int | None] = [device.index for device in devices or ()]
    indices = [index for index in given if index is not None]
    if not indices or indices == list(range(len(indices))):
        return
    raise ConfigurationError(
        f"DeepSpeed puts each process on the device of its local rank ({list(range(len(indices)))}"
        f"), and the devices asked for are {indices}",
        value=indices,
        fix=f"choose the devices with CUDA_VISIBLE_DEVICES={','.join(map(str, indices))} and "
        f"pass devices={len(indices)}",
    )


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(
            f"{name}={value!r} must be True or False",
            value=value,
            fix=f"pass {name}=True or {name}=False",
        )
    return value


class DeepSpeedStrategy(SelfLaunchingStrategy):
    """Data-parallel training with DeepSpeed's ZeRO, optionally offloaded to the CPU.

    ZeRO partitions the optimizer state (stage 1), then the gradients (2), then the
    parameters (3) across ranks; offload keeps them on the CPU.

    The engine is made from the module and the one optimizer the user configured
    (`setup_module_and_optimizers`); backward, the optimizer step and gradient
    clipping go through it and nowhere else. Gradient accumulation is plait's: the
    engine's backward accumulates locally, and each `optimizer_step` is a boundary
    (the Trainer's ``accumulate_grad_batches``, or several backward passes before a
    step in a loop of your own). The precision maps to DeepSpeed's by its dtypes:
    bf16, fp16 (loss scaled dynamically) or fp32.

    deepspeed is imported when the strategy joins its process group, never before;
    without it installed, making the strategy raises an error that names the extra
    (``plait-strategies[deepspeed]``). Nothing is compiled: the optimizer is the
    user's torch optimizer, and DeepSpeed's shared-memory collective op is left out.

    ``accelerator``, ``parallel_devices``, ``cluster_environment``, ``precision``
    (``precision_plugin``), ``process_group_backend``, ``timeout``, ``start_timeout``
    and ``checked_collectives`` are `ParallelStrategy`'s.

    Args:
        stage: The ZeRO stage: 0 (plain data parallelism), 1 (optimizer state
            partitioned), 2 (and gradients), 3 (and parameters). By default the
            config's, else 2.
        offload_optimizer: Keep the optimizer state on the CPU and step there (stages 1-3).
        offload_parameters: Keep the parameters on the CPU between uses (stage 3).
        config: DeepSpeed's configuration, a dict or the path of a JSON file; merged
            with the settings plait derives (a setting plait requires that the config
            sets otherwise raises, naming both values; keys DeepSpeed does not read
            are refused, with the closest known one).
        logging_level: The level of DeepSpeed's logger (``logging.WARNING`` by default).
        pin_memory: Pin offloaded tensors (by default, on GPUs only).
        checkpoint_io: Only DeepSpeed's own (the default): the engine writes its
            partitioned state, every rank its part.
        offload_optimizer_device: ``"cpu"`` or ``"nvme"``: where an offloaded
            optimizer state goes (NVMe needs DeepSpeed's async_io op, libaio).
        offload_params_device: ``"cpu"`` or ``"nvme"``: where offloaded parameters go.
        nvme_path: The directory on NVMe storage that offloaded state is swapped to.
        params_buffer_count: Buffers for parameters swapped in from NVMe.
        optimizer_buffer_count: Buffers for optimizer state swapped in from NVMe.
        partition_activations: With ``deepspeed.checkpointing.checkpoint`` in the
            model: partition the checkpointed activations across ranks.
        cpu_checkpointing: Keep checkpointed activations on the CPU.
        contiguous_memory_optimization: Copy checkpointed activations into one
            contiguous buffer.
        synchronize_checkpoint_boundary: Synchronise the device at each checkpoint
            boundary.
        exclude_frozen_parameters: Leave parameters that do not train
            (``requires_grad=False``) out of saved checkpoints.
        start_method: How the ranks are started when no scheduler did: ``"popen"``
            (run the program again) or one of torch.multiprocessing's.

    Without ``config``, the path in ``PL_DEEPSPEED_CONFIG_PATH`` (Lightning's
    variable) is read, if set.

    Raises:
        ConfigurationError: deepspeed is not installed, an option is out of range or
            cannot go with another, the config conflicts with them, or a device's
            index is not its process's local rank (the engine would take that one:
            choose devices with ``CUDA_VISIBLE_DEVICES``).
    """

    def __init__(
        self,
        *,
        stage: int | None = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        config: Mapping[str, object] | PathLike | None = None,
        logging_level: int = logging.WARNING,
        pin_memory: bool | None = None,
        accelerator: Accelerator | str | None = None,
        parallel_devices: Sequence[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | str | None = None,
        precision: Precision | str | None = None,
        precision_plugin: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
        start_method: str = "popen",
        process_group_backend: str | None = None,
        timeout: timedelta = DEFAULT_TIMEOUT,
        start_timeout: timedelta = DEFAULT_START_TIMEOUT,
        checked_collectives: bool = True,
        offload_optimizer_device: str = "cpu",
        offload_params_device: str = "cpu",
        nvme_path: str = "/local_nvme",
        params_buffer_count: int = 5,
        optimizer_buffer_count: int = 4,
        partition_activations: bool = False,
        cpu_checkpointing: bool = False,
        contiguous_memory_optimization: bool = False,
        synchronize_checkpoint_boundary: bool = False,
        exclude_frozen_parameters: bool = False,
    ) -> None:
        library.require_deepspeed()
        offload = Offload(
            optimizer_device=offload_optimizer_device,
            params_device=offload_params_device,
            nvme_path=nvme_path,
            params_buffer_count=params_buffer_count,
            optimizer_buffer_count=optimizer_buffer_count,
        )
        activation_checkpointing = {
            name: _check_flag(name, value)
            for name, value in (
                ("partition_activations", partition_activations),
                ("cpu_checkpointing", cpu_checkpointing),
                ("contiguous_memory_optimization", contiguous_memory_optimization),
                ("synchronize_checkpoint_boundary", synchronize_checkpoint_boundary),
            )
        }
        self.exclude_frozen_parameters = _check_flag(
            "exclude_frozen_parameters", exclude_frozen_parameters
        )
        if config is None and os.environ.get(CONFIG_PATH_VARIABLE):
            config = os.environ[CONFIG_PATH_VARIABLE]
        if stage is not None and (isinstance(stage, bool) or stage not in STAGES):
            raise ConfigurationError.invalid_choice(
                "stage", stage, [str(s) for s in STAGES], fix="pass stage=0, 1, 2 or 3"
            )
        check_start_method(start_method)
        if checkpoint_io is not None:
            raise ConfigurationError(
                f"checkpoint_io={checkpoint_io!r}: DeepSpeed's engine writes its checkpoints "
                "itself (each rank its partitions), through no other checkpoint IO",
                value=checkpoint_io,
                fix="leave checkpoint_io out; export one file with "
                "plait.strategies.consolidate_checkpoint",
            )
        offload_optimizer = _check_flag("offload_optimizer", offload_optimizer)
        offload_parameters = _check_flag("offload_parameters", offload_parameters)
        level: object = logging_level
        if isinstance(level, bool) or not isinstance(level, int):
            raise ConfigurationError(
                f"logging_level={logging_level!r} must be a logging level",
                value=logging_level,
                fix="pass e.g. logging_level=logging.INFO",
            )
        self.logging_level = logging_level
        self.start_method = start_method
        self._engine: Engine | None = None
        self._client_optimizer: torch.optim.Optimizer | None = None
        # The optimizer's parameters, in its order, before the engine replaced them by
        # ZeRO's flat groups (whole optimizer states are keyed by them), and their
        # names in the engine's module.
        self._optimizer_parameters: list[torch.nn.Parameter] = []
        self._optimizer_names: list[str] = []
        self._loaded_by_engine = False
        super().__init__(
            **process_group_options(locals(), checkpoint_io=DeepSpeedCheckpointIO(self))
        )
        _check_device_indices(parallel_devices)
        declared = declared_keys()
        check_supported(declared)
        user = read_config(config)
        check_keys(user, KNOWN_KEYS | declared)
        explicit_precision = precision is not None or precision_plugin is not None
        required, defaults = derive_config(
            stage=stage,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            pin_memory=self.root_device.type == "cuda" if pin_memory is None else pin_memory,
            precision=self._precision_name() if explicit_precision else None,
            client_optimizer="optimizer" not in user,
            offload=offload,
            activation_checkpointing=activation_checkpointing,
        )
        if "train_batch_size" not in user:
            # DeepSpeed insists on a batch size; it counts samples with it, nothing more.
            defaults["train_micro_batch_size_per_gpu"] = 1
        self.config: dict[str, object] = merge_config(user, required, defaults)
        """DeepSpeed's configuration: the user's, merged with plait's settings.

        The engine is made with its communication buckets sized from the module
        (`plait.strategies.deepspeed.config.sized_buckets`), unless the config sets them."""
        self._user_config = user
        self.stage = config_stage(self.config)
        self.precision_name = config_precision(self.config)
        self.offload_optimizer = offloads(self.config, "offload_optimizer")
        self.offload_parameters = offloads(self.config, "offload_param")
        self._check_offload()
        if "nvme" in (
            offload_device(self.config, "offload_optimizer"),
            offload_device(self.config, "offload_param"),
        ):
            library.require_async_io()
        if self.precision_name == "fp16" and self.root_device.type == "cpu":
            raise ConfigurationError(
                "DeepSpeed trains in fp16 on GPUs only, and the strategy's device is the CPU",
                value="fp16",
                choices=["32-true", "bf16-mixed", "bf16-true"],
                fix="pass precision='bf16-mixed' (or '32-true') on the CPU",
            )

    def _precision_name(self) -> str:
        return precision_name(str(self.precision.compute_dtype).removeprefix("torch."))

    def _check_offload(self) -> None:
        if self.offload_parameters and self.stage != 3:
            raise ConfigurationError(
                f"parameters are offloaded at ZeRO stage 3 only, and the stage is {self.stage}",
                value=self.stage,
                fix="pass stage=3 with offload_parameters=True",
            )
        if self.offload_optimizer and self.stage == 0:
            raise ConfigurationError(
                "the optimizer is offloaded at ZeRO stages 1-3 only, and the stage is 0",
                value=self.stage,
                fix="pass stage=1, 2 or 3 with offload_optimizer=True",
            )

    @property
    @override
    def training_semantics(self) -> TrainingSemantics:
        """Synchronous replicas (at every ZeRO stage), bit-for-bit resumes; moves to DDP.

        Each rank keeps its own buffers (the engine broadcasts them once, at set-up).
        """
        return TrainingSemantics(compatible=("ddp",), buffers="own")

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the engine holds the module in (its optimizer keeps fp32 copies)."""
        return _DTYPES[self.precision_name]

    @property
    def engine(self) -> Engine:
        """DeepSpeed's engine (after set-up).

        Raises:
            ConfigurationError: No module was set up yet.
        """
        if self._engine is None:
            raise ConfigurationError(
                "the strategy has no DeepSpeed engine before a module is set up",
                fix="call strategy.setup_module_and_optimizers(module, [optimizer]) first",
            )
        return self._engine

    @override
    def setup_environment(self) -> None:
        """Join the process group, then hand it to DeepSpeed's communication layer."""
        super().setup_environment()
        deepspeed = library.import_deepspeed(self.root_device.type)
        logging.getLogger("DeepSpeed").setLevel(self.logging_level)
        deepspeed.init_distributed(
            dist_backend=self.process_group_backend, dist_init_required=False
        )

    # The module.

    @contextlib.contextmanager
    @override
    def model_sharded_context(self) -> Iterator[None]:
        """At stage 3, build the model partitioned: each rank holds only its share.

        Outside stage 3, the model is built as usual.

        Raises:
            ConfigurationError: The strategy has not joined its process group yet.
        """
        if self.stage != 3:
            yield
            return
        if self._collectives is None:
            raise ConfigurationError(
                "a model is partitioned at creation across the process group, which the "
                "strategy has not joined yet",
                fix="call strategy.setup_environment() first",
            )
        deepspeed = library.import_deepspeed()
        with deepspeed.zero.Init(
            config_dict_or_path=self.config,
            remote_device="cpu" if self.offload_parameters else None,
        ):  # the dtype from the config (an explicit one is overridden on CPUs)
            yield

    @override
    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Make the engine from ``module`` alone (for evaluation: no optimizer)."""
        return self._initialize(module, None)

    @override
    def setup_optimizers(
        self, optimizers: Sequence[torch.optim.Optimizer]
    ) -> list[torch.optim.Optimizer]:
        """Nothing to prepare after `setup_module`: the engine takes its optimizer at set-up.

        Raises:
            ConfigurationError: Optimizers were given, which the engine made without
                one cannot take.
        """
        if optimizers:
            raise ConfigurationError(
                "DeepSpeed's engine takes its optimizer when it is made, and it was made "
                "by setup_module without one",
                fix="call setup_module_and_optimizers(module, [optimizer]) instead",
            )
        return []

    @override
    def setup_module_and_optimizers(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> tuple[torch.nn.Module, list[torch.optim.Optimizer]]:
        """Make the engine from ``module`` and its one optimizer.

        Returns:
            The engine (a module: call it for the forward pass) and the optimizer,
            which `optimizer_step` steps through the engine and schedulers drive.

        Raises:
            ConfigurationError: More than one optimizer, an optimizer that is not the
                module's, or one given with an ``optimizer`` section in the config.
        """
        self.check_optimizers_belong(module, optimizers)
        if len(optimizers) > 1:
            raise ConfigurationError(
                f"DeepSpeed's engine drives one optimizer, and {len(optimizers)} were given",
                value=[type(o).__name__ for o in optimizers],
                fix="use one optimizer, with a parameter group per set of hyper-parameters",
            )
        if optimizers and "optimizer" in self.config:
            raise ConfigurationError(
                f"an optimizer was given ({type(optimizers[0]).__name__}) and the DeepSpeed "
                f"config makes one too ({self.config['optimizer']!r})",
                value=self.config["optimizer"],
                fix="remove 'optimizer' from the config, or configure no optimizer",
            )
        engine = self._initialize(module, optimizers[0] if optimizers else None)
        return engine, list(optimizers)

    def _initialize(
        self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> torch.nn.Module:
        if self._collectives is None:
            raise ConfigurationError(
                "DeepSpeed's engine is made over the process group, which the strategy "
                "has not joined yet",
                fix="call strategy.setup_environment() first",
            )
        # Decided together: a launcher may hand one rank a fresh copy of the module
        # and another the module an earlier run partitioned in place.
        generation = self.job_generation
        marks = {getattr(m, _PARTITIONED_BY, None) for m in module.modules()} - {None}
        stale = bool(marks - {generation})
        if self.reduce_boolean_decision(stale, all=False):
            raise ConfigurationError(
                "the module was partitioned at ZeRO stage 3 in an earlier job of this "
                f"program (on {'this rank' if stale else 'another rank'}), in place, over "
                "a process group that has ended",
                value=type(module).__name__,
                fix="keep the job's process group between runs (it lives until the program "
                "ends, unless end_job() was called or a run failed), or build the module "
                "anew and load the checkpoint into it (strategy.load_checkpoint(path, model); "
                "with the Trainer, trainer.validate(Model(), ckpt_path='last'))",
            )
        if self.offload_optimizer or self.offload_parameters or self.uses_config_optimizer:
            # Only these may compile an op: a dead build's lock would stall it silently.
            library.check_extension_locks()
        deepspeed = library.import_deepspeed()
        # DeepSpeed makes the config's optimizer over the trainable parameters.
        parameters = (
            [p for group in optimizer.param_groups for p in group["params"]]
            if optimizer is not None
            else [p for p in module.parameters() if p.requires_grad]
            if self.uses_config_optimizer
            else []
        )
        config = self.config if optimizer is not None else self._evaluation_config()
        if isinstance(config.get("activation_checkpointing"), Mapping):
            library.configure_activation_checkpointing(config)
        # A partitioned parameter holds its whole size in ds_numel.
        elements = sum(int(getattr(p, "ds_numel", p.numel())) for p in module.parameters())
        with library.quiet():
            made, *_ = deepspeed.initialize(
                model=module,
                optimizer=optimizer,
                config=sized_buckets(config, self._user_config, elements),
                dist_init_required=False,
            )
        if not isinstance(made, torch.nn.Module):  # DeepSpeedEngine is a module
            raise TypeError(f"deepspeed.initialize made a {type(made).__name__}, not a module")
        if self.stage == 3:  # partitioned in place: on this job's group
            for submodule in module.modules():
                setattr(submodule, _PARTITIONED_BY, generation)
        _statistics_in(module, self.compute_dtype)
        self._engine = cast("Engine", made)
        self._client_optimizer = optimizer
        self._optimizer_parameters = parameters
        self._optimizer_names = parameter_names(module, parameters)
        self._model = made
        return made

    def _evaluation_config(self) -> dict[str, object]:
        if self.stage == 3 or self.uses_config_optimizer:
            return self.config
        # Stages 1 and 2 partition only what an optimizer holds, and DeepSpeed makes
        # them with one: without it, the engine is made at stage 0.
        zero = self.config.get("zero_optimization")
        assert isinstance(zero, Mapping)
        kept = {key: value for key, value in zero.items() if key != "offload_optimizer"}
        return {**self.config, "zero_optimization": {**kept, "stage": 0}}

    @property
    def has_optimizer(self) -> bool:
        """Whether the engine was made with an optimizer (to train, not only evaluate)."""
        return self._engine is not None and (
            self._client_optimizer is not None or self.uses_config_optimizer
        )

    @property
    def optimizer_parameter_names(self) -> list[str]:
        """The names of the optimizer's parameters in the module, in the optimizer's order."""
        return list(self._optimizer_names)

    @property
    def uses_config_optimizer(self) -> bool:
        """Whether DeepSpeed makes the optimizer from the config's ``optimizer`` section."""
        return "optimizer" in self.config

    @override
    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module inside the engine."""
        if self._engine is not None and module is self._model:
            return self._engine.module
        return module

    # Steps.

    @override
    def _forward(
        self, module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> object:
        # The engine holds the module in its dtype: floating inputs follow it.
        dtype = self.compute_dtype
        if dtype is not torch.float32:
            args = tuple(_cast_floating(arg, dtype) for arg in args)
            kwargs = {key: _cast_floating(value, dtype) for key, value in kwargs.items()}
        with library.quiet():  # ZeRO-3 gathers each block's parameters as it runs
            return module(*args, **kwargs)

    @override
    def check_closure_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse: the engine steps its own optimizer, which takes no closure.

        Raises:
            ConfigurationError: Always, naming the optimizer and the fix.
        """
        self.refuse_closure_optimizer(
            optimizer,
            "DeepSpeed's engine steps its optimizer over ZeRO's partitions, without a closure",
        )

    @override
    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None = None) -> None:
        """Backward through the engine (loss scaled for fp16), accumulating locally."""
        with library.quiet():
            self.engine.backward(loss)

    @override
    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], object] | None = None,
    ) -> object:
        """Step through the engine: reduce the accumulated gradients, clip, and step.

        ``closure`` (which runs forward and `backward`) is called first.

        Raises:
            ConfigurationError: ``optimizer`` is not the engine's, or the step is
                inside `no_sync`.
        """
        self.check_not_accumulating()
        if optimizer is not self._client_optimizer:
            raise ConfigurationError(
                f"{type(optimizer).__name__} is not the optimizer the DeepSpeed engine "
                "was made with",
                value=optimizer,
                fix="step the optimizer setup_module_and_optimizers returned",
            )
        result = closure() if closure is not None else None
        with library.quiet():
            self.engine.step()
        return result

    @override
    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Nothing: the engine clears the gradients in its step."""

    @override
    def clip_gradients_norm(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> torch.Tensor:
        """Refused: the engine clips inside its step, and has no norm to give before it.

        Raises:
            ConfigurationError: Always, before anything is set, with the calls to make.
        """
        raise ConfigurationError(
            "DeepSpeed clips the gradients inside its engine's step, and has no norm to give "
            "back before it",
            value="clip_gradients_norm",
            fix="call strategy.clip_gradients(model, optimizer, max_norm), the bound the step "
            "clips to (or set 'gradient_clipping' in the DeepSpeed config)",
        )

    @override
    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> None:
        """Have the engine clip the gradients' global norm to ``clip_val`` at its next step.

        DeepSpeed clips in its step (after reducing the partitioned gradients), so
        the bound is set on the engine here and applied there, once.

        Raises:
            ConfigurationError: ``algorithm`` is ``"value"`` (DeepSpeed clips by norm
                only), or the config's ``gradient_clipping`` is another bound.
        """
        if algorithm != "norm":
            raise ConfigurationError(
                f"DeepSpeed clips gradients by their norm, and the algorithm is {algorithm!r}",
                value=algorithm,
                choices=["norm"],
                fix="pass gradient_clip_algorithm='norm'",
            )
        configured = self.config.get("gradient_clipping")
        if isinstance(configured, int | float) and configured > 0 and configured != clip_val:
            raise ConfigurationError(
                f"DeepSpeed configuration conflict at 'gradient_clipping': the config says "
                f"{configured!r}, and the clipping asked for is {clip_val!r}",
                value=configured,
                fix="remove gradient_clipping from the config, or clip with the same value",
            )
        engine = self.engine
        # Read at each step: by the engine (fp32 stage 0), by its optimizer (the rest).
        engine._config.gradient_clipping = float(clip_val)  # type: ignore[attr-defined]
        inner = engine.optimizer
        if hasattr(inner, "clip_grad"):
            inner.clip_grad = float(clip_val)

    # State.

    @override
    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        """The module's whole state; with ``optimizers``, nothing (the engine saves them).

        Every rank calls it. Without optimizers, the module's state is whole on
        every rank (at stage 3 it is gathered one submodule at a time, to the CPU).
        With them (a checkpoint to resume from), the engine writes the module's and
        the optimizer's partitions itself in `save_checkpoint`, and ``state_dict``
        and ``optimizer_states`` are left empty.
        """
        if optimizers:
            return {"state_dict": {}, "optimizer_states": [], "precision": {}}
        return {
            "state_dict": self._whole_module_state(self.unwrap_module(module)),
            "optimizer_states": [],
            "precision": {},
        }

    @property
    @override
    def shards_module(self) -> bool:
        """At stage 3 each rank holds only its partition of the parameters."""
        return self.stage == 3

    @override
    def full_module_state(self, module: torch.nn.Module) -> StateDict:
        """The whole state on every rank (at stage 3, gathered a submodule at a time)."""
        return self._whole_module_state(self.unwrap_module(module))

    def _whole_module_state(self, module: torch.nn.Module) -> StateDict:
        if self.stage != 3:
            return {key: value.detach().cpu() for key, value in module.state_dict().items()}
        deepspeed = library.import_deepspeed()
        state: StateDict = {}
        for prefix, submodule in module.named_modules():
            own = list(submodule.parameters(recurse=False))
            with library.quiet(), deepspeed.zero.GatheredParameters(own, modifier_rank=None):
                for name, tensor in submodule.named_parameters(recurse=False):
                    state[f"{prefix}.{name}" if prefix else name] = tensor.detach().cpu().clone()
            for name, buffer in submodule.named_buffers(recurse=False):
                if name not in submodule._non_persistent_buffers_set:
                    state[f"{prefix}.{name}" if prefix else name] = buffer.detach().cpu()
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
        """Load a whole state (another strategy's checkpoint, say) into the engine.

        Every rank calls it with the whole state and keeps its part: the module's
        weights, ZeRO's fp32 copy of them (which each step writes back), and, with
        ``optimizers``, the optimizer's state (Adam's moments into each rank's
        partition, the step, the groups' learning rates). A checkpoint
        `read_checkpoint` loaded through the engine is in place already.

        Raises:
            CheckpointError: The state does not fit the module, or its optimizer state
                does not fit the optimizer (another kind, other parameter groups).
        """
        if self._loaded_by_engine:
            self._loaded_by_engine = False
            return
        module_state = module_state_of(state, source)
        target = self.unwrap_module(module)
        if self.stage != 3:
            load_module_state(target, module_state, source)
        else:
            self._load_partitioned(target, module_state, source)
        if not self.has_optimizer:
            return
        set_master_weights(target, module_state, rank=self.global_rank, world_size=self.world_size)
        if not optimizers:
            return
        [saved] = optimizer_states_of(state, len(optimizers), source)
        # Named in the module given (the engine's, or the user's inside it).
        names = [
            own or recorded
            for own, recorded in zip(
                parameter_names(target, self._optimizer_parameters),
                self._optimizer_names,
                strict=True,
            )
        ]
        keyed = optimizer_state_keyed(saved, names, by_name=True, source=source)
        if not any(is_partitioned(parameter) for parameter in target.parameters()):
            # Stage 0 in fp32: the optimizer holds the module's own parameters.
            optimizers[0].load_state_dict(
                optimizer_state_keyed(keyed, names, by_name=False, source=source)
            )
            return
        engine_optimizer = self.engine.optimizer
        base = getattr(engine_optimizer, "optimizer", engine_optimizer)
        assert isinstance(base, torch.optim.Optimizer)
        # This rank's flat fp32 tensors the base optimizer steps (at stage 3 given to
        # it only during a step).
        flats = [p for group in base.param_groups for p in group["params"]] or list(
            getattr(engine_optimizer, "fp32_partitioned_groups_flat", [])
        )
        # Stages 1 and 2 tie each parameter to its part of the optimizer's state at
        # the first step; before it, tied by DeepSpeed's own call, as a step makes it.
        tie = getattr(engine_optimizer, "_lazy_init_hp_params_optimizer_state", None)
        with library.quiet():
            set_optimizer_state(
                dict(zip(names, self._optimizer_parameters, strict=True)),
                base,
                flats,
                keyed,
                link=tie if callable(tie) else lambda: None,
                rank=self.global_rank,
                world_size=self.world_size,
                source=source,
            )

    def load_whole_module_state(self, state: Mapping[str, object], *, source: object) -> None:
        """Load a whole state (keys of the engine's module) into the engine's module.

        Every rank calls it; at stage 3 only rank 0's ``state`` is read (and its
        partitions sent to the others).
        """
        target = self.engine.module
        if self.stage != 3:
            load_module_state(target, state, source)
            return
        self._load_partitioned(target, state, source)

    def _load_partitioned(
        self, target: torch.nn.Module, state: Mapping[str, object], source: object
    ) -> None:
        deepspeed = library.import_deepspeed()
        parameters = list(target.parameters())
        with library.quiet(), deepspeed.zero.GatheredParameters(parameters, modifier_rank=0):
            if self.is_global_zero:
                load_module_state(target, state, source)

    @override
    def read_in_place(
        self,
        path: PathLike,
        module: torch.nn.Module | None,
        *,
        weights_only: bool,
        recognized: bool,
    ) -> Checkpoint | None:
        """Read a checkpoint: through the engine, in place, if DeepSpeed wrote it.

        The engine loads its module's partitions (and, when it has an optimizer, the
        optimizer's), each rank its own. Another checkpoint (a file, a
        `torch.distributed.checkpoint` directory, DeepSpeed's of another ZeRO stage
        or world size) is read whole, its optimizer state with it unless
        ``weights_only``, for `set_state_dict` to partition.

        Raises:
            CheckpointError: A DeepSpeed checkpoint given before set-up, or one the
                engine cannot read.
        """
        del module
        if not recognized:
            # No registered format's (another strategy's are read whole before):
            # read whole.
            return read_whole(path, optimizers=not weights_only)
        if self._engine is None:
            raise CheckpointError(
                str(path),
                "is a DeepSpeed checkpoint, which the engine loads after set-up",
                fix="call setup_module_and_optimizers first, or consolidate it to one file "
                "with plait.strategies.consolidate_checkpoint",
            )
        if self.has_optimizer and checkpoint_layout(path) != (self.stage, self.world_size):
            # Another ZeRO stage or world size: ZeRO's partitions, rebuilt whole, are
            # partitioned anew by set_state_dict.
            return read_whole(path, optimizers=not weights_only)
        assert isinstance(self.checkpoint_io, DeepSpeedCheckpointIO)
        checkpoint = self.checkpoint_io.load_into_engine(path, optimizer=not weights_only)
        self._loaded_by_engine = True
        return checkpoint

    @override
    def teardown(self) -> None:
        """Release the engine, then leave the process group."""
        engine, self._engine = self._engine, None
        self._client_optimizer = None
        self._optimizer_parameters, self._optimizer_names = [], []
        self._loaded_by_engine = False
        if engine is not None:
            engine.destroy()
        super().teardown()

    @override
    def destroy_process_group(self) -> None:
        """Destroy the process groups through DeepSpeed, which forgets its own with them.

        DeepSpeed keeps the groups it made (data parallel, ...) in globals: a later
        run would reuse them, destroyed, without this.
        """
        library.import_deepspeed().comm.destroy_process_group()

    @override
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(stage={self.stage}, "
            f"offload_optimizer={self.offload_optimizer}, "
            f"offload_parameters={self.offload_parameters}, "
            f"precision={self.precision_name!r}, "
            f"world_size={self.world_size}, device={str(self.root_device)!r})"
        )
