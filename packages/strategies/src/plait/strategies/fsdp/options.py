"""The options of `FSDPStrategy`, checked when the strategy is made and put in FSDP2's terms.

Users come with FSDP1's vocabulary (``ShardingStrategy.SHARD_GRAD_OP``,
``CPUOffload(offload_params=True)``, ``MixedPrecision(buffer_dtype=...)``,
``BackwardPrefetch.BACKWARD_PRE``, ``partial(size_based_auto_wrap_policy, ...)``) and with
FSDP2's (``CPUOffloadPolicy``, ``MixedPrecisionPolicy``). Both are accepted where FSDP2 can
do what is asked; what it cannot do is refused here, with the replacement named.

``torch.distributed.fsdp`` takes about a second to import: it is imported only when a
value that may come from it has to be recognised.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import torch

from plait.core import ConfigurationError
from plait.core.errors import suggest

if TYPE_CHECKING:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

__all__ = [
    "SHARDING_STRATEGIES",
    "STATE_DICT_TYPES",
    "ModulePolicy",
    "ShardingPlan",
    "SizeBasedPolicy",
    "backward_prefetch_depth",
    "buffer_dtype_of",
    "check_fully_shard_kwargs",
    "module_policy",
    "offload_policy",
    "precision_policy",
    "sharding_plan",
    "state_dict_type",
]

SHARDING_STRATEGIES: Final = (
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
)
"""How parameters, gradients and optimizer state are spread (FSDP1's names)."""

STATE_DICT_TYPES: Final = ("full", "sharded")
"""What a checkpoint holds: the whole state on rank 0, or each rank's shards."""

ModulePolicy = Callable[[torch.nn.Module], bool]
"""Chooses submodules: ``True`` for each one the option applies to."""


def _fsdp_loaded() -> bool:
    # A value made with torch.distributed.fsdp's classes means it is imported already.
    return "torch.distributed.fsdp" in sys.modules


@dataclass(frozen=True)
class ShardingPlan:
    """A sharding strategy in FSDP2's terms.

    Attributes:
        name: One of `SHARDING_STRATEGIES`.
        reshard_after_forward: Free the gathered parameters after forward (and gather
            them again for backward), or keep them until backward ends.
        hybrid: Shard within groups of ranks and replicate across groups (a 2-D mesh).
        replicate_only: Keep whole parameters on every rank (DDP's layout, FSDP's
            machinery): a 2-D mesh whose shard dimension has size 1.
    """

    name: str
    reshard_after_forward: bool
    hybrid: bool = False
    replicate_only: bool = False


def sharding_plan(value: object) -> ShardingPlan:
    """The plan for a sharding strategy given by name (any case) or FSDP1's enum."""
    name = getattr(value, "name", value)
    if isinstance(name, str):
        name = name.upper().lstrip("_")
    if name not in SHARDING_STRATEGIES:
        raise ConfigurationError.invalid_choice("sharding_strategy", value, SHARDING_STRATEGIES)
    return {
        "FULL_SHARD": ShardingPlan("FULL_SHARD", reshard_after_forward=True),
        "SHARD_GRAD_OP": ShardingPlan("SHARD_GRAD_OP", reshard_after_forward=False),
        "NO_SHARD": ShardingPlan("NO_SHARD", reshard_after_forward=False, replicate_only=True),
        "HYBRID_SHARD": ShardingPlan("HYBRID_SHARD", reshard_after_forward=True, hybrid=True),
        "HYBRID_SHARD_ZERO2": ShardingPlan(
            "HYBRID_SHARD_ZERO2", reshard_after_forward=False, hybrid=True
        ),
    }[str(name)]


def state_dict_type(value: object) -> str:
    """``"full"`` or ``"sharded"`` (FSDP1's ``StateDictType`` names are understood)."""
    name = getattr(value, "name", value)
    if isinstance(name, str):
        name = {"FULL_STATE_DICT": "full", "SHARDED_STATE_DICT": "sharded"}.get(name, name)
    if name not in STATE_DICT_TYPES:
        raise ConfigurationError.invalid_choice("state_dict_type", value, STATE_DICT_TYPES)
    return str(name)


def offload_policy(value: object, device: torch.device) -> CPUOffloadPolicy | None:
    """FSDP2's offload policy for ``cpu_offload`` (a bool, FSDP1's `CPUOffload`, or a policy).

    Pinned host memory speeds copies to a GPU and needs one: it is asked for only
    when ``device`` is a GPU.
    """
    if value is None or value is False:
        return None
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy  # noqa: PLC0415

    pin = device.type == "cuda"
    if value is True:
        return CPUOffloadPolicy(pin_memory=pin)
    if isinstance(value, CPUOffload):
        return CPUOffloadPolicy(pin_memory=pin) if value.offload_params else None
    if isinstance(value, CPUOffloadPolicy):
        if value.pin_memory and not torch.accelerator.is_available():
            raise ConfigurationError(
                "cpu_offload=CPUOffloadPolicy(pin_memory=True) pins host memory, which needs "
                "an accelerator, and this machine has none",
                value=value,
                fix="pass cpu_offload=True, or CPUOffloadPolicy(pin_memory=False)",
            )
        return value
    raise ConfigurationError(
        f"cpu_offload={value!r} is not a bool, a CPUOffloadPolicy or a CPUOffload",
        value=value,
        fix="pass cpu_offload=True to keep parameters and gradients on the CPU",
    )


def precision_policy(
    value: object, compute_dtype: torch.dtype, param_dtype: torch.dtype, reduce_dtype: torch.dtype
) -> MixedPrecisionPolicy:
    """FSDP2's mixed-precision policy: ``mixed_precision`` if given, else the plugin's dtypes.

    ``value`` may be FSDP2's `MixedPrecisionPolicy` or FSDP1's `MixedPrecision`
    (its ``buffer_dtype`` is applied by the strategy, see `buffer_dtype_of`).
    """
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy  # noqa: PLC0415

    if value is None:
        if compute_dtype == param_dtype:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype)
    if isinstance(value, MixedPrecisionPolicy):
        return value
    if isinstance(value, MixedPrecision):
        if value.keep_low_precision_grads:
            raise ConfigurationError(
                "mixed_precision=MixedPrecision(keep_low_precision_grads=True) has no "
                "equivalent in FSDP2, whose gradients take the sharded parameters' dtype",
                value=value,
                fix="drop keep_low_precision_grads; reduce in low precision with reduce_dtype=",
            )
        return MixedPrecisionPolicy(
            param_dtype=value.param_dtype,
            reduce_dtype=value.reduce_dtype,
            cast_forward_inputs=value.cast_forward_inputs or value.cast_root_forward_inputs,
        )
    raise ConfigurationError(
        f"mixed_precision={value!r} is not a MixedPrecisionPolicy or a MixedPrecision",
        value=value,
        fix="pass torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16), "
        "or leave it out and choose the Trainer's precision (e.g. 'bf16-mixed')",
    )


def buffer_dtype_of(value: object) -> torch.dtype | None:
    """The dtype buffers are cast to (FSDP1's ``MixedPrecision.buffer_dtype``), if any."""
    if value is None or not _fsdp_loaded():
        return None
    from torch.distributed.fsdp import MixedPrecision  # noqa: PLC0415

    return value.buffer_dtype if isinstance(value, MixedPrecision) else None


@dataclass(frozen=True)
class SizeBasedPolicy:
    """Shard a submodule on its own once it holds at least ``min_num_params`` parameters.

    Parameters already in a smaller submodule sharded on its own do not count toward
    its parents. FSDP1's ``partial(size_based_auto_wrap_policy, min_num_params=N)``
    means the same.
    """

    min_num_params: int = 100_000_000

    def __post_init__(self) -> None:
        count: object = self.min_num_params  # checked as given: callers pass user input
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigurationError(
                f"min_num_params={count!r} must be a positive int",
                value=count,
                fix="pass e.g. SizeBasedPolicy(min_num_params=1_000_000)",
            )


def _classes_policy(classes: Collection[type[torch.nn.Module]]) -> ModulePolicy:
    chosen = tuple(classes)

    def policy(module: torch.nn.Module) -> bool:
        return isinstance(module, chosen)

    return policy


def module_policy(  # noqa: PLR0911 (one return per kind of value accepted)
    option: str, value: object
) -> ModulePolicy | SizeBasedPolicy | None:
    """A policy from layer classes, a callable ``module -> bool``, or a size-based policy.

    FSDP1's ``ModuleWrapPolicy`` and ``partial(size_based_auto_wrap_policy, ...)`` are
    understood; FSDP1's other callables (``(module, recurse, nonwrapped_numel)``) are not.
    """
    if value is None:
        return None
    if isinstance(value, SizeBasedPolicy):
        return value
    if isinstance(value, type) and issubclass(value, torch.nn.Module):
        return _classes_policy([value])
    if isinstance(value, list | tuple | set | frozenset):
        bad = [
            item
            for item in value
            if not (isinstance(item, type) and issubclass(item, torch.nn.Module))
        ]
        if bad or not value:
            raise ConfigurationError(
                f"{option}={value!r} must list torch.nn.Module subclasses; "
                + (f"{bad[0]!r} is not one" if bad else "it is empty"),
                value=value,
                fix=f"pass the layer classes, e.g. {option}={{TransformerBlock}}",
            )
        return _classes_policy(value)
    classes = getattr(value, "_module_classes", None)  # FSDP1's ModuleWrapPolicy
    if isinstance(classes, set | frozenset | list | tuple):
        return _classes_policy(classes)
    if (
        isinstance(value, functools.partial)
        and getattr(value.func, "__name__", "") == "size_based_auto_wrap_policy"
    ):
        return SizeBasedPolicy(int(value.keywords.get("min_num_params", 100_000_000)))
    if callable(value):
        try:
            arity = len(inspect.signature(value).parameters)
        except (TypeError, ValueError):
            arity = 1  # a builtin: taken as module -> bool
        if arity > 1:
            raise ConfigurationError(
                f"{option}={value!r} takes FSDP1's (module, recurse, nonwrapped_numel); "
                "FSDP2 shards each chosen module once, and asks only which",
                value=value,
                fix=f"pass {option}= a set of layer classes, a function module -> bool, "
                "or SizeBasedPolicy(min_num_params)",
            )
        return value  # a callable of one argument: module -> bool
    raise ConfigurationError(
        f"{option}={value!r} is not a layer class, a set of them, or a function module -> bool",
        value=value,
        fix=f"pass e.g. {option}={{TransformerBlock}}",
    )


def backward_prefetch_depth(value: object) -> int | None:
    """How many blocks to prefetch in backward: ``None`` leaves it to FSDP2 (one, implicitly).

    FSDP1's ``BACKWARD_PRE`` is one block, explicitly; FSDP2 has no ``BACKWARD_POST``.
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigurationError(
                f"backward_prefetch={value} must be at least 1 (blocks to prefetch)",
                value=value,
                fix="pass 1 or 2, or None to let FSDP2 prefetch one block implicitly",
            )
        return value
    name = getattr(value, "name", value)
    if name == "BACKWARD_PRE":
        return 1
    if name == "BACKWARD_POST":
        raise ConfigurationError(
            "backward_prefetch=BACKWARD_POST has no equivalent in FSDP2, which issues the "
            "next block's all-gather before the current block's gradients, as BACKWARD_PRE",
            value=value,
            fix="pass backward_prefetch='BACKWARD_PRE' (or an int of blocks), or None",
        )
    raise ConfigurationError.invalid_choice(
        "backward_prefetch", value, ("BACKWARD_PRE", "an int >= 1", "None")
    )


_SET_BY_STRATEGY: Final = {
    "module": "the strategy shards the module it is given",
    "mesh": "pass device_mesh= (or the sharding_strategy) to the strategy",
    "mp_policy": "pass mixed_precision= to the strategy, or choose the Trainer's precision",
    "offload_policy": "pass cpu_offload= to the strategy",
}

_FSDP1_ONLY: Final = {
    "use_orig_params": "FSDP2 always keeps the original parameters (as DTensors): drop it",
    "limit_all_gathers": "FSDP2 bounds its in-flight all-gathers itself: drop it",
    "forward_prefetch": "FSDP2 prefetches the next block in forward implicitly: drop it "
    "(or call set_modules_to_forward_prefetch on the sharded modules)",
    "sync_module_states": "FSDP2 shards each rank's own copy: seed every rank alike "
    "(seed_everything) or build the model under strategy.model_sharded_context()",
    "param_init_fn": "define reset_parameters() on the modules and build the model under "
    "strategy.model_sharded_context()",
    "device_id": "the strategy puts each rank on its device: pass parallel_devices=",
    "process_group": "pass device_mesh= to the strategy",
    "ignored_modules": "pass ignored_params= (the parameters FSDP2 leaves unsharded)",
    "auto_wrap_policy": "auto_wrap_policy is an option of the strategy itself",
}


def check_fully_shard_kwargs(kwargs: Mapping[str, object]) -> None:
    """Refuse keyword options ``fully_shard`` does not take, naming the replacement."""
    if not kwargs:
        return
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    accepted = [
        name for name in inspect.signature(fully_shard).parameters if name not in _SET_BY_STRATEGY
    ]
    for name in kwargs:
        if name in _SET_BY_STRATEGY:
            raise ConfigurationError(
                f"FSDPStrategy sets fully_shard's {name}= itself",
                value=name,
                fix=_SET_BY_STRATEGY[name],
            )
        if name in _FSDP1_ONLY:
            raise ConfigurationError(
                f"{name}= is an option of FSDP1, which FSDPStrategy (on FSDP2's fully_shard) "
                "does not take",
                value=name,
                fix=_FSDP1_ONLY[name],
            )
        if name not in accepted:
            raise ConfigurationError(
                f"FSDPStrategy got the option {name}=, which neither it nor fully_shard takes",
                value=name,
                choices=accepted,
                suggestion=suggest(name, accepted),
                fix="correct the name; FSDPStrategy passes the options it does not take "
                "itself to torch.distributed.fsdp.fully_shard",
            )
