"""FSDPStrategy's options: accepted in FSDP1's or FSDP2's terms where FSDP2 can; else refused.

Every refusal names the bad value and the replacement, when the strategy is made.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy
from typing_extensions import override

from plait.core import ConfigurationError, StrategyRegistry
from plait.strategies import DDPFullyShardedNativeStrategy, FSDPStrategy
from plait.strategies.fsdp import SizeBasedPolicy
from plait.strategies.fsdp.options import (
    buffer_dtype_of,
    module_policy,
    offload_policy,
    precision_policy,
    sharding_plan,
)
from plait.strategies.fsdp.parallelize import (
    _blocks,
    apply_activation_checkpointing,
    check_materializable,
)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.calls = 0

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out: torch.Tensor = torch.relu(self.linear(x))
        return out


@pytest.mark.parametrize(
    ("given", "reshard", "hybrid", "replicate_only"),
    [
        ("FULL_SHARD", True, False, False),
        ("shard_grad_op", False, False, False),
        (ShardingStrategy.NO_SHARD, False, False, True),
        (ShardingStrategy.HYBRID_SHARD, True, True, False),
        (ShardingStrategy._HYBRID_SHARD_ZERO2, False, True, False),
    ],
)
def test_sharding_strategies_map_onto_fsdp2(
    given: object, reshard: bool, hybrid: bool, replicate_only: bool
) -> None:
    plan = sharding_plan(given)
    assert (plan.reshard_after_forward, plan.hybrid, plan.replicate_only) == (
        reshard, hybrid, replicate_only,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"sharding_strategy": "FULL"}, ["'FULL'", "FULL_SHARD"]),
        ({"backward_prefetch": BackwardPrefetch.BACKWARD_POST}, ["BACKWARD_POST", "BACKWARD_PRE"]),
        ({"backward_prefetch": 0}, ["at least 1"]),
        ({"use_orig_params": True}, ["FSDP1", "drop it"]),
        ({"sync_module_states": True}, ["FSDP1", "model_sharded_context"]),
        ({"reshard_after_foward": True}, ["reshard_after_foward", "reshard_after_forward"]),
        ({"mesh": None}, ["sets fully_shard's mesh", "device_mesh"]),
        ({"device_mesh": (2, 2)}, ["hybrid", "HYBRID_SHARD"]),
        ({"sharding_strategy": "HYBRID_SHARD", "device_mesh": (2, 0)}, ["positive ints"]),
        ({"state_dict_type": "local"}, ["'local'", "full", "sharded"]),
        ({"state_dict_type": "sharded", "checkpoint_io": "torch"}, ["rank 0 alone", "distributed"]),
        ({"state_dict_type": "full", "checkpoint_io": "distributed"}, ["every rank", "'torch'"]),
        ({"cpu_offload": "yes"}, ["cpu_offload='yes'", "cpu_offload=True"]),
        ({"cpu_offload": CPUOffloadPolicy(pin_memory=True)}, ["pin_memory=False"]),
        ({"mixed_precision": MixedPrecision(keep_low_precision_grads=True)}, ["reduce_dtype"]),
        ({"mixed_precision": "bf16"}, ["MixedPrecisionPolicy"]),
        ({"auto_wrap_policy": [Block, 3]}, ["3 is not one"]),
        ({"auto_wrap_policy": size_based_auto_wrap_policy}, ["FSDP1's (module, recurse"]),
        ({"activation_checkpointing": SizeBasedPolicy(10)}, ["not a size-based policy"]),
        ({"activation_checkpointing": Block, "activation_checkpointing_policy": Block}, ["both"]),
        ({"start_method": "thread"}, ["'thread'", "popen"]),
    ],
)
def test_bad_options_are_refused_when_the_strategy_is_made(
    options: dict[str, object], words: list[str]
) -> None:
    if (
        isinstance(options.get("cpu_offload"), CPUOffloadPolicy)
        and torch.accelerator.is_available()
    ):
        pytest.skip("pinned memory is available on this machine")
    with pytest.raises(ConfigurationError) as raised:
        FSDPStrategy(accelerator="cpu", **options)  # type: ignore[arg-type]
    message = str(raised.value)
    for word in words:
        assert word in message, message


def test_fsdp1_values_are_understood() -> None:
    cpu = torch.device("cpu")
    on = True
    assert offload_policy(on, cpu) == CPUOffloadPolicy(pin_memory=False)
    assert offload_policy(CPUOffload(offload_params=True), cpu) == CPUOffloadPolicy(
        pin_memory=False
    )
    assert offload_policy(CPUOffload(offload_params=False), cpu) is None
    fsdp1 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                           buffer_dtype=torch.bfloat16)  # fmt: skip
    policy = precision_policy(fsdp1, torch.float32, torch.float32, torch.float32)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert buffer_dtype_of(fsdp1) == torch.bfloat16
    wrap = module_policy("auto_wrap_policy", ModuleWrapPolicy({Block}))
    assert callable(wrap)
    assert wrap(Block())
    sized = module_policy(
        "auto_wrap_policy", functools.partial(size_based_auto_wrap_policy, min_num_params=7)
    )
    assert sized == SizeBasedPolicy(7)


def test_the_precision_plugins_dtypes_make_the_default_policy() -> None:
    mixed = precision_policy(None, torch.bfloat16, torch.float32, torch.float32)
    assert mixed == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert precision_policy(None, torch.float32, torch.float32, torch.float32) == (
        MixedPrecisionPolicy()
    )


def test_a_size_based_policy_chooses_the_innermost_modules_big_enough() -> None:
    model = torch.nn.Sequential(Block(), Block(), torch.nn.Sequential(Block(), Block()))
    blocks = _blocks(model, SizeBasedPolicy(20))  # each Block's Linear holds 20 parameters
    assert [type(m) for m in blocks] == [torch.nn.Linear] * 4
    outer = _blocks(model, SizeBasedPolicy(40))
    assert outer == [model[2]]  # the two small blocks together reach 40


def test_activation_checkpointing_recomputes_the_forward_in_backward() -> None:
    model = torch.nn.Sequential(Block(), Block())
    chosen = apply_activation_checkpointing(model, lambda m: isinstance(m, Block))
    assert chosen == [model[0], model[1]]
    state = set(model.state_dict())
    model(torch.randn(3, 4, requires_grad=True)).sum().backward()
    assert [b.calls for b in (model[0], model[1])] == [2, 2]  # forward, then again in backward
    with torch.no_grad():
        model(torch.randn(3, 4))
    assert [b.calls for b in (model[0], model[1])] == [3, 3]
    assert set(model.state_dict()) == state  # names unchanged
    # Applied twice, still once.
    assert apply_activation_checkpointing(model, lambda m: isinstance(m, Block)) == []


def test_a_meta_model_without_reset_parameters_is_refused_naming_the_tensors() -> None:
    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = torch.nn.Parameter(torch.ones(3))

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), Scale())
    with pytest.raises(ConfigurationError, match=r"1\.gain.*reset_parameters"):
        check_materializable(model)


def test_the_fsdp_family_is_registered_with_descriptions() -> None:
    names = {"fsdp", "fsdp_cpu_offload", "fsdp_native", "fsdp_native_full_shard_offload",
             "fsdp_shard_grad_op", "fsdp_no_shard", "fsdp_hybrid_shard"}  # fmt: skip
    assert names <= set(StrategyRegistry.available_strategies())
    for name in names:
        assert StrategyRegistry.entry(name).description
    offload = StrategyRegistry.get("fsdp_cpu_offload")
    assert isinstance(offload, FSDPStrategy)
    assert offload.cpu_offload is not None
    assert DDPFullyShardedNativeStrategy is FSDPStrategy
    # The seed's constructor call.
    seed = DDPFullyShardedNativeStrategy(
        cpu_offload=CPUOffload(offload_params=True),
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16),
        activation_checkpointing=[Block],
    )
    assert seed.backward_prefetch == 1


def test_optimizers_are_made_again_only_over_a_module_set_up_first() -> None:
    layer = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigurationError, match="no module was set up yet"):
        FSDPStrategy(accelerator="cpu").setup_optimizers([torch.optim.SGD(layer.parameters())])
