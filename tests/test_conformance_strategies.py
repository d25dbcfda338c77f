"""Every strategy registered here that runs on CPU keeps the collective contract.

The conformance suite runs on each at world sizes 1 to 4 over gloo; ``tools/check``
selects the thorough profile when CI is set. Strategies that need other hardware
are listed with the reason, so that a new registration cannot be left out silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from plait.conformance import ConformanceSuite
from plait.core import StrategyRegistry

XLA_LANE: Final = (
    "needs torch_xla, which runs beside its own torch: the XLA lane (tools/check xla) "
    "runs the suite on it at world size 1"
)

NOT_ON_CPU: Final = {
    "dp": "DataParallel runs over CUDA GPUs",
    "single_xla": XLA_LANE,
    "xla": XLA_LANE,
    "xla_debug": "'xla' with torch_xla's debug output: " + XLA_LANE + " as 'xla'",
    "xla_fsdp": "needs torch_xla (the XLA lane); one process, a single process's collectives",
}
"""Registered strategies that cannot run on this lane, and why."""

ONE_PROCESS: Final = ("example_strategy", "single_device")
"""Strategies of one process: world size 1 is the only one they have."""

FSDP_VARIANTS: Final = (
    "fsdp_cpu_offload",
    "fsdp_hybrid_shard",
    "fsdp_native",
    "fsdp_native_full_shard_offload",
    "fsdp_no_shard",
    "fsdp_shard_grad_op",
)
"""``fsdp`` with other sharding options: its collectives, so run at world size 2 only."""

DEEPSPEED_VARIANTS: Final = (
    "deepspeed_stage_1",
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
)
"""``deepspeed`` at other ZeRO stages: its collectives, so run at world size 2 only."""

DDP_VARIANTS: Final = (
    "ddp_find_unused_parameters_true",
    "ddp_fork",
    "ddp_notebook",
    "ddp_sharded",
    "ddp_spawn",
)
"""``ddp`` with another launcher or wrapper option, or a sharded optimizer: DDP's
collectives, which the conformance ranks call without the launcher."""

OWN_COLLECTIVES: Final = ("example_bytes_ddp",)
"""A third party's DDP with collectives of its own (``ParallelStrategy.make_collectives``)."""

MULTI_PROCESS: Final = tuple(
    name
    for name in StrategyRegistry.available_strategies()
    if name not in NOT_ON_CPU
    and name not in ONE_PROCESS
    and name not in DDP_VARIANTS
    and name not in FSDP_VARIANTS
    and name not in DEEPSPEED_VARIANTS
    and name not in OWN_COLLECTIVES
)


class TestMultiProcessStrategies(ConformanceSuite):
    strategies = MULTI_PROCESS
    world_sizes = (1, 2, 3, 4)


# The variants' collectives are their family's, which runs the whole profile above:
# the grid and a fourth of the drawn examples prove that the options change none.


class TestDDPVariants(ConformanceSuite):
    strategies = DDP_VARIANTS
    world_sizes = (1, 2, 3, 4)
    max_examples = 50


class TestFSDPVariants(ConformanceSuite):
    strategies = FSDP_VARIANTS
    world_sizes = (2,)
    max_examples = 50


class TestDeepSpeedVariants(ConformanceSuite):
    strategies = DEEPSPEED_VARIANTS
    world_sizes = (2,)
    max_examples = 50


class TestOwnCollectives(ConformanceSuite):
    strategies = OWN_COLLECTIVES
    world_sizes = (1, 2, 3)


BACKEND_AGREEMENT: Final = (
    f"{Path(__file__).with_name('backend_agreement.py')}:ddp_agreeing_through_the_process_group"
)
"""DDP agreeing through the process group at every size (``auto``: above 16 ranks)."""


class TestAgreementThroughTheProcessGroup(ConformanceSuite):
    strategies = (BACKEND_AGREEMENT,)
    world_sizes = (1, 2, 3, 4)
    max_examples = 60  # a fourth of the thorough profile: the same properties as ddp's


class TestOneProcessStrategies(ConformanceSuite):
    strategies = ONE_PROCESS
    world_sizes = (1,)


def test_every_registered_strategy_is_run_or_excused() -> None:
    registered = set(StrategyRegistry.available_strategies())

    assert set(ONE_PROCESS) <= registered
    assert set(NOT_ON_CPU) <= registered
    assert {"ddp", "fsdp", "deepspeed"} <= set(MULTI_PROCESS)
    assert set(DDP_VARIANTS) <= registered
    assert set(FSDP_VARIANTS) <= registered
    assert set(DEEPSPEED_VARIANTS) <= registered
    assert set(OWN_COLLECTIVES) <= registered
    assert registered == (
        set(MULTI_PROCESS)
        | set(DDP_VARIANTS)
        | set(OWN_COLLECTIVES)
        | set(FSDP_VARIANTS)
        | set(DEEPSPEED_VARIANTS)
        | set(ONE_PROCESS)
        | set(NOT_ON_CPU)
    )
