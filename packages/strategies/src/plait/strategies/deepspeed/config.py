"""DeepSpeed's configuration: the user's, merged with what the strategy derives.

Pure Python: nothing here imports deepspeed. A configuration is a JSON object (a dict,
or a file holding one). The strategy derives two kinds of settings:

* **required** ones, from what was asked of plait explicitly (the ZeRO stage and
  offload the strategy was made with, the precision, plait's ownership of gradient
  accumulation): a user value that differs is a conflict, and both are named;
* **defaults**, used only where the user's configuration says nothing (a micro-batch
  size DeepSpeed insists on, the ZeRO stage when none was given anywhere).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import attrs

from plait.core import ConfigurationError

if TYPE_CHECKING:
    from plait.core.typing import PathLike

__all__ = [
    "ACTIVATION_CHECKPOINTING",
    "BUCKETS",
    "KNOWN_KEYS",
    "OFFLOAD_DEVICES",
    "STAGES",
    "Offload",
    "derive_config",
    "merge_config",
    "read_config",
    "sized_buckets",
    "unknown_keys",
]

STAGES: Final = (0, 1, 2, 3)

# DeepSpeed's top-level configuration keys (its documented configuration reference),
# completed by the names its installed version declares (`known_keys`).
KNOWN_KEYS: Final = frozenset(
    {
        "activation_checkpointing", "aio", "amp", "autotuning", "bf16", "bfloat16",
        "checkpoint", "comms_logger", "communication_data_type", "compile",
        "compression_training", "csv_monitor", "curriculum_learning", "data_efficiency",
        "data_types", "dataloader_drop_last", "disable_allgather", "dump_state",
        "eigenvalue", "elasticity", "expert_parallel", "flops_profiler", "fp16",
        "gradient_accumulation_dtype", "gradient_accumulation_steps",
        "gradient_allreduce_op", "gradient_clipping", "gradient_predivide_factor",
        "graph_harvesting", "hybrid_engine", "load_universal_checkpoint", "log_level",
        "managed_gradient_accumulation", "memory_breakdown", "mics_hierarchical_params_gather",
        "mics_shard_size", "monitor_config", "nebula", "optimizer", "pipeline",
        "prescale_gradients", "progressive_layer_drop", "quantize_training",
        "seq_parallel_communication_data_type", "sequence_parallel_size", "scheduler",
        "sparse_attention", "sparse_gradients", "steps_per_print", "tensor_parallel",
        "tensorboard", "timers", "torch_autocast", "train_batch_size",
        "train_micro_batch_size_per_gpu", "use_data_before_expert_parallel_",
        "use_node_local_storage", "wall_clock_breakdown", "wandb", "weight_quantization",
        "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "zero_optimization",
        "zenflow", "disable_python_gc", "dist_backend",
    }
)  # fmt: skip

_PRECISIONS: Final = ("fp32", "bf16", "fp16")


def read_config(config: Mapping[str, object] | PathLike | None) -> dict[str, object]:
    """The user's configuration as a dict: ``config`` itself, or the JSON file it names.

    Raises:
        ConfigurationError: The file is missing or is not a JSON object (the line
            and column of a syntax error are named), or ``config`` is neither.
    """
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return _checked_object(dict(config), "config")
    if not isinstance(config, str | os.PathLike):
        raise ConfigurationError(
            f"config={config!r} is a {type(config).__name__}: DeepSpeed's configuration "
            "is a dict or the path of a JSON file",
            value=config,
            fix="pass config={'zero_optimization': {'stage': 2}} or config='ds_config.json'",
        )
    path = os.fspath(config)
    try:
        with open(path, encoding="utf-8") as file:
            loaded = json.load(file)
    except FileNotFoundError as error:
        raise ConfigurationError(
            f"config={path!r}: no such file",
            value=path,
            fix="pass the path of an existing DeepSpeed JSON configuration, or a dict",
        ) from error
    except json.JSONDecodeError as error:
        raise ConfigurationError(
            f"config={path!r} is not valid JSON: {error.msg} at line {error.lineno}, "
            f"column {error.colno}",
            value=path,
            fix="correct the file (JSON has no comments and no trailing commas)",
        ) from error
    return _checked_object(loaded, path)


def _checked_object(config: object, source: str) -> dict[str, object]:
    if not isinstance(config, dict) or not all(isinstance(key, str) for key in config):
        raise ConfigurationError(
            f"the DeepSpeed configuration from {source} is a {type(config).__name__}, "
            "not a JSON object with string keys",
            value=config,
            fix='write the configuration as {"key": value, ...}',
        )
    return config


def unknown_keys(config: Mapping[str, object], known: frozenset[str]) -> list[str]:
    """The top-level keys of ``config`` that DeepSpeed does not read, sorted."""
    return sorted(key for key in config if key not in known)


def check_keys(config: Mapping[str, object], known: frozenset[str]) -> None:
    """Refuse top-level keys DeepSpeed would ignore silently (a misspelt key, say).

    Raises:
        ConfigurationError: Naming each unknown key, with the closest known one.
    """
    unknown = unknown_keys(config, known)
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    raise ConfigurationError(
        f"the DeepSpeed configuration has keys DeepSpeed does not read: {', '.join(hints)}",
        value=unknown,
        fix="correct their spelling, or remove them (see DeepSpeed's configuration "
        "reference for the keys it reads)",
    )


def precision_name(compute_dtype: str) -> str:
    """DeepSpeed's name for a precision whose compute dtype is ``compute_dtype``.

    Raises:
        ConfigurationError: DeepSpeed trains in fp32, bf16 or fp16 only.
    """
    names = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    name = names.get(compute_dtype)
    if name is None:
        raise ConfigurationError(
            f"DeepSpeed trains in float32, bfloat16 or float16, and the precision "
            f"computes in {compute_dtype}",
            value=compute_dtype,
            choices=["32-true", "bf16-mixed", "bf16-true", "16-mixed"],
            fix="pass precision='32-true', 'bf16-mixed' or '16-mixed'",
        )
    return name  # fp16 scales its loss in DeepSpeed (dynamically, by plait's default)


OFFLOAD_DEVICES: Final = ("cpu", "nvme")
"""Where ZeRO offloads: the CPU's memory, or NVMe storage (DeepSpeed's async_io op)."""


@attrs.frozen(kw_only=True)
class Offload:
    """Where offloaded state goes, and ZeRO-Infinity's buffers for NVMe.

    Attributes:
        optimizer_device: ``"cpu"`` or ``"nvme"``, for the optimizer state.
        params_device: ``"cpu"`` or ``"nvme"``, for the parameters (stage 3).
        nvme_path: The directory on NVMe storage the state is swapped to.
        params_buffer_count: Buffers for parameters swapped in from NVMe.
        optimizer_buffer_count: Buffers for optimizer state swapped in from NVMe.
    """

    optimizer_device: str = "cpu"
    params_device: str = "cpu"
    nvme_path: str = "/local_nvme"
    params_buffer_count: int = 5
    optimizer_buffer_count: int = 4

    def __attrs_post_init__(self) -> None:
        for name in ("optimizer_device", "params_device"):
            value = getattr(self, name)
            if value not in OFFLOAD_DEVICES:
                raise ConfigurationError.invalid_choice(
                    f"offload_{name.removesuffix('_device')}_device", value, OFFLOAD_DEVICES
                )
        for name in ("params_buffer_count", "optimizer_buffer_count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"{name}={value!r} must be an int of at least 1",
                    value=value,
                    fix=f"pass e.g. {name}=4",
                )

    def section(self, kind: str, pin_memory: bool) -> dict[str, object]:
        """DeepSpeed's ``offload_optimizer`` or ``offload_param`` section."""
        device = self.optimizer_device if kind == "offload_optimizer" else self.params_device
        section: dict[str, object] = {"device": device, "pin_memory": pin_memory}
        if device == "nvme":
            section["nvme_path"] = self.nvme_path
            section["buffer_count"] = (
                self.optimizer_buffer_count
                if kind == "offload_optimizer"
                else self.params_buffer_count
            )
        return section


ACTIVATION_CHECKPOINTING: Final = (
    "partition_activations",
    "cpu_checkpointing",
    "contiguous_memory_optimization",
    "synchronize_checkpoint_boundary",
)
"""DeepSpeed's activation checkpointing options (for ``deepspeed.checkpointing.checkpoint``
in the model), as the strategy takes them."""


def derive_config(
    *,
    stage: int | None,
    offload_optimizer: bool,
    offload_parameters: bool,
    pin_memory: bool,
    precision: str | None,
    client_optimizer: bool,
    offload: Offload | None = None,
    activation_checkpointing: Mapping[str, bool] | None = None,
) -> tuple[dict[str, object], dict[str, object]]:
    """The settings plait requires, and the defaults it fills in.

    Args:
        stage: The ZeRO stage asked for explicitly (``None``: the user's
            configuration's, else 2).
        offload_optimizer: Keep the optimizer state (and its step) on the CPU.
        offload_parameters: Keep the parameters on the CPU between uses (stage 3).
        pin_memory: Pin the offloaded tensors (for copies to a GPU).
        precision: DeepSpeed's name for the precision asked for explicitly
            (``"fp32"``, ``"bf16"``, ``"fp16"``), or ``None``.
        client_optimizer: The optimizer is the user's own (a torch optimizer).
        offload: Where offloaded state goes (the CPU by default).
        activation_checkpointing: The options of `ACTIVATION_CHECKPOINTING` set true.

    Returns:
        ``(required, defaults)``.
    """
    required: dict[str, object] = {
        # plait decides where accumulation ends (the Trainer's accumulate_grad_batches,
        # or the caller's optimizer_step): the engine's backward accumulates locally,
        # and each engine step is a boundary.
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
    }
    zero: dict[str, object] = {}
    if stage is not None:
        zero["stage"] = stage
    offload = offload or Offload()
    if offload_optimizer:
        zero["offload_optimizer"] = offload.section("offload_optimizer", pin_memory)
    if offload_parameters:
        zero["offload_param"] = offload.section("offload_param", pin_memory)
    if zero:
        required["zero_optimization"] = zero
    chosen = {key: True for key, value in (activation_checkpointing or {}).items() if value}
    if chosen:
        required["activation_checkpointing"] = chosen
    if precision is not None:
        required["bf16"] = {"enabled": precision == "bf16"}
        required["fp16"] = {"enabled": precision == "fp16"}
    defaults: dict[str, object] = {
        "zero_optimization": {"stage": 2},
        # DeepSpeed clips to a norm of 1.0 unless told otherwise; plait clips only when
        # asked (Trainer(gradient_clip_val=...), or the config's own bound).
        "gradient_clipping": 0.0,
    }
    if client_optimizer:
        # A torch optimizer runs ZeRO (and its offload) without DeepSpeed's compiled ones.
        defaults["zero_allow_untested_optimizer"] = True
        defaults["zero_force_ds_cpu_optimizer"] = False
    if precision == "fp16":
        defaults["fp16"] = {"loss_scale": 0}  # dynamic loss scaling
    return required, defaults


BUCKETS: Final = {
    # DeepSpeed's key: its default size, in elements.
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
}
"""DeepSpeed's communication buckets, which `sized_buckets` sizes from the model."""

_BUCKETS_OF_STAGE: Final[dict[int, tuple[str, ...]]] = {
    1: ("reduce_bucket_size", "allgather_bucket_size"),
    2: ("reduce_bucket_size", "allgather_bucket_size"),
    3: ("reduce_bucket_size", "stage3_prefetch_bucket_size"),
}

_ALIGNMENT: Final = 1024

_SPELLINGS: Final = {
    # What else sets a bucket's size in a config (DeepSpeed's older names).
    "allgather_bucket_size": ("allgather_size",),
    "stage3_prefetch_bucket_size": ("prefetch_bucket_size",),
}


def sized_buckets(
    config: Mapping[str, object], user: Mapping[str, object], elements: int
) -> dict[str, object]:
    """``config`` with the communication buckets no larger than the model they carry.

    DeepSpeed allocates each bucket whole (500M elements for the reduce and
    all-gather buckets, 2 GB in fp32), and torch's deterministic mode fills every
    new tensor: for a model of a few million parameters, a step would allocate and
    fill far more than the model itself. A bucket is sized ``min(default,
    elements)``, rounded up to a multiple of 1024 (every parameter still fits in
    one), unless the user's own
    configuration ``user`` sets it: a size given explicitly always wins.

    Args:
        config: The configuration the engine is made with.
        user: The user's configuration, as given.
        elements: The model's parameter count (whole, not partitioned).
    """
    zero = config.get("zero_optimization")
    if not isinstance(zero, Mapping):
        return dict(config)
    stage = zero.get("stage")
    given = user.get("zero_optimization")
    given = given if isinstance(given, Mapping) else {}
    # Rounded up to a multiple of 1024: DeepSpeed aligns buffers (its all-gather
    # bucket must be a multiple of 2 elements).
    fitted = -(-max(elements, 1) // _ALIGNMENT) * _ALIGNMENT
    sized = {
        key: min(BUCKETS[key], fitted)
        for key in _BUCKETS_OF_STAGE.get(stage if isinstance(stage, int) else 0, ())
        if key not in given and not any(other in given for other in _SPELLINGS.get(key, ()))
    }
    return {**config, "zero_optimization": {**zero, **sized}}


def merge_config(
    user: Mapping[str, object],
    required: Mapping[str, object],
    defaults: Mapping[str, object],
) -> dict[str, object]:
    """``user``'s configuration, completed by ``defaults`` and checked against ``required``.

    Raises:
        ConfigurationError: A required setting that the user's configuration sets
            otherwise; both values are named, with the key's dotted path.
    """
    merged = _require(dict(user), required, "")
    return _fill(merged, defaults)


def _fill(config: dict[str, object], defaults: Mapping[str, object]) -> dict[str, object]:
    for key, value in defaults.items():
        mine = config.get(key)
        if key not in config:
            config[key] = _copy(value)
        elif isinstance(mine, Mapping) and isinstance(value, Mapping):
            config[key] = _fill(dict(mine), value)
    return config


def _require(
    config: dict[str, object], required: Mapping[str, object], prefix: str
) -> dict[str, object]:
    for key, value in required.items():
        path = f"{prefix}{key}"
        if key not in config:
            config[key] = _copy(value)
            continue
        mine = config[key]
        if isinstance(value, Mapping):
            if not isinstance(mine, Mapping):
                raise _conflict(path, mine, value)
            config[key] = _require(dict(mine), value, f"{path}.")
        elif not _same(mine, value):
            raise _conflict(path, mine, value)
    return config


def _same(mine: object, value: object) -> bool:
    if isinstance(value, bool) or isinstance(mine, bool):
        return type(mine) is type(value) and mine == value
    return mine == value


def _conflict(path: str, mine: object, value: object) -> ConfigurationError:
    why = _WHY.get(path.rsplit(".", 1)[-1], "the strategy was made with it")
    return ConfigurationError(
        f"DeepSpeed configuration conflict at {path!r}: the config says {mine!r}, and "
        f"plait requires {value!r} ({why})",
        value=mine,
        fix=f"remove {path!r} from the config, or make the strategy with settings that "
        "agree with it",
    )


_WHY: Final = {
    "gradient_accumulation_steps": "accumulation is Trainer(accumulate_grad_batches=...) "
    "or calling optimizer_step after several backward passes",
    "managed_gradient_accumulation": "plait says when accumulation ends",
    "stage": "from the strategy's stage argument",
    "offload_optimizer": "from offload_optimizer=True",
    "offload_param": "from offload_parameters=True",
    "device": "from the strategy's offload arguments",
    "pin_memory": "pinned only for a GPU",
    "enabled": "from the precision",
}


def _copy(value: object) -> object:
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    return value


def is_precision_enabled(config: Mapping[str, object], name: str) -> bool:
    """Whether ``config`` enables ``name`` (``"bf16"`` or ``"fp16"``)."""
    section = config.get(name)
    return isinstance(section, Mapping) and section.get("enabled") is True


def config_precision(config: Mapping[str, object]) -> str:
    """DeepSpeed's name for the precision ``config`` trains in.

    Raises:
        ConfigurationError: It enables both bf16 and fp16.
    """
    bf16, fp16 = is_precision_enabled(config, "bf16"), is_precision_enabled(config, "fp16")
    if bf16 and fp16:
        raise ConfigurationError(
            "the DeepSpeed configuration enables both bf16 and fp16",
            value={"bf16": config.get("bf16"), "fp16": config.get("fp16")},
            choices=list(_PRECISIONS),
            fix="enable one of them (or pass the strategy a precision)",
        )
    return "bf16" if bf16 else "fp16" if fp16 else "fp32"


def config_stage(config: Mapping[str, object]) -> int:
    """The ZeRO stage of a merged configuration.

    Raises:
        ConfigurationError: It is not 0, 1, 2 or 3.
    """
    zero = config.get("zero_optimization")
    stage = zero.get("stage", 0) if isinstance(zero, Mapping) else 0
    if isinstance(stage, bool) or stage not in STAGES:
        raise ConfigurationError.invalid_choice(
            "ZeRO stage", stage, [str(s) for s in STAGES], fix="pass stage=0, 1, 2 or 3"
        )
    assert isinstance(stage, int)
    return stage


def offload_device(config: Mapping[str, object], section: str) -> object:
    """The device of ``config``'s ZeRO ``section`` (``offload_optimizer``/``offload_param``).

    ``"none"`` where the section is absent or names none.
    """
    zero = config.get("zero_optimization")
    offload = zero.get(section) if isinstance(zero, Mapping) else None
    device = offload.get("device", "none") if isinstance(offload, Mapping) else "none"
    return "none" if device is None else device


def offloads(config: Mapping[str, object], section: str) -> bool:
    """Whether ``config``'s ZeRO ``section`` (``offload_optimizer``/``offload_param``) offloads."""
    return offload_device(config, section) != "none"


def known_keys() -> frozenset[str]:
    """`KNOWN_KEYS`, with the names the installed deepspeed declares in its constants."""
    return KNOWN_KEYS | declared_keys()


def declared_keys() -> frozenset[str]:
    """The configuration keys the installed deepspeed declares in its constants.

    Read from its source files, without importing it (which takes seconds); empty
    when deepspeed is not installed.
    """
    import importlib.util  # noqa: PLC0415
    import re  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    spec = importlib.util.find_spec("deepspeed")
    if spec is None or spec.origin is None:
        return frozenset()
    root = Path(spec.origin).parent
    declared: set[str] = set()
    pattern = re.compile(r"^[A-Z][A-Z0-9_]*\s*=\s*[\"']([a-z][a-z0-9_]*)[\"']\s*$", re.MULTILINE)
    for name in ("runtime/constants.py", "runtime/zero/constants.py", "profiling/constants.py"):
        path = root / name
        if path.is_file():
            declared.update(pattern.findall(path.read_text(encoding="utf-8")))
    return frozenset(declared)


def check_supported(declared: frozenset[str]) -> None:
    """Refuse a deepspeed too old to let plait say where gradient accumulation ends.

    Raises:
        ConfigurationError: Its configuration has no ``managed_gradient_accumulation``.
    """
    if declared and "managed_gradient_accumulation" not in declared:
        raise ConfigurationError(
            "the installed deepspeed has no 'managed_gradient_accumulation' setting, "
            "which plait needs to say where gradient accumulation ends",
            value="deepspeed",
            fix="pip install --upgrade 'plait-strategies[deepspeed]' (deepspeed>=0.19.8)",
        )
