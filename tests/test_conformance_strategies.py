"""Every strategy registered here that runs on CPU keeps the collective contract and
trains as it declares.

The conformance suite runs on each at world sizes 1 to 4 over gloo; ``tools/check``
selects the thorough profile when CI is set. The training properties
(`plait.conformance.TrainingSuite`) run on the same rank pools, at world sizes 1 to
3, a few drawn runs each (a run trains three times over: tens of collectives where a
collective example has one). Strategies that need other hardware are listed with the
reason, so that a new registration cannot be left out silently; a name registered
exactly as another (an alias) is proven under that other name.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Final

from plait.conformance import ConformanceSuite, TrainingSuite
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

LAUNCHED_ALIKE: Final = {
    "ddp_fork_find_unused_parameters_true": "ddp_find_unused_parameters_true",
    "ddp_spawn_find_unused_parameters_true": "ddp_find_unused_parameters_true",
}
"""Lightning's names for a proven variant started by another launcher: the conformance
and training ranks never use the launcher, so each is proven under the name it maps to
(its settings are that name's but for ``start_method``, checked below). The
``ddp_notebook_`` spelling is an alias of the ``ddp_fork_`` one."""

OWN_COLLECTIVES: Final = ("example_bytes_ddp",)
"""A third party's DDP with collectives of its own (``ParallelStrategy.make_collectives``)."""

ON_A_MESH: Final = ("model_parallel",)
"""Strategies on a named device mesh: at 1 and 3 ranks on the mesh they choose, at 2
and 4 on given shapes, over the job and each dimension (`TestMeshDimensions`)."""


def _aliases() -> dict[str, str]:
    # A name registered with the factory and settings of an earlier one builds the
    # same strategy (a Lightning spelling, a launcher's other name).
    first: dict[tuple[object, str], str] = {}
    aliases: dict[str, str] = {}
    for name in sorted(StrategyRegistry.available_strategies()):
        entry = StrategyRegistry.entry(name)
        key = (entry.factory, repr(sorted(entry.init_params.items())))
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases


ALIASES: Final = _aliases()
"""Each name registered exactly as another one is (the same factory and settings), and
that name: proven once, under it (`test_every_registered_strategy_is_run_or_excused`)."""


def _proven(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(name for name in names if name not in ALIASES)


MULTI_PROCESS: Final = tuple(
    name
    for name in StrategyRegistry.available_strategies()
    if name not in ALIASES
    and name not in NOT_ON_CPU
    and name not in ONE_PROCESS
    and name not in DDP_VARIANTS
    and name not in LAUNCHED_ALIKE
    and name not in FSDP_VARIANTS
    and name not in DEEPSPEED_VARIANTS
    and name not in OWN_COLLECTIVES
    and name not in ON_A_MESH
)


class TestMultiProcessStrategies(ConformanceSuite, TrainingSuite):
    strategies = MULTI_PROCESS
    world_sizes = (1, 2, 3, 4)
    training_world_sizes = (1, 2, 3)
    training_examples = 3  # after the grid: a run trains three times over
    moves_world_sizes = (2,)  # each move starts the ranks of the strategy moved to


# The variants' collectives are their family's, which runs the whole profile above:
# the grid and a fourth of the drawn examples prove that the options change none.


class TestDDPVariants(ConformanceSuite):
    strategies = _proven(DDP_VARIANTS)
    world_sizes = (1, 2, 3, 4)
    max_examples = 50


DDP_OPTIONS: Final = ("ddp_find_unused_parameters_true", "ddp_sharded")
"""The DDP variants whose options change training (the others change the launcher,
which the conformance ranks do not use: they train as ``ddp``)."""


class TestTrainingOfDDPOptions(TrainingSuite):
    strategies = DDP_OPTIONS
    world_sizes = (2,)
    training_examples = 2
    moves_world_sizes = ()


class TestFSDPVariants(ConformanceSuite, TrainingSuite):
    strategies = _proven(FSDP_VARIANTS)
    world_sizes = (2,)
    max_examples = 50
    training_examples = 2
    moves_world_sizes = ()  # fsdp's own, at world size 2


class TestDeepSpeedVariants(ConformanceSuite, TrainingSuite):
    strategies = _proven(DEEPSPEED_VARIANTS)
    world_sizes = (2,)
    max_examples = 50
    training_examples = 2
    moves_world_sizes = ()  # deepspeed's own, at world size 2


class TestOwnCollectives(ConformanceSuite, TrainingSuite):
    strategies = _proven(OWN_COLLECTIVES)
    world_sizes = (1, 2, 3)
    training_examples = 2
    moves_world_sizes = (2,)


BACKEND_AGREEMENT: Final = (
    f"{Path(__file__).with_name('backend_agreement.py')}:ddp_agreeing_through_the_process_group"
)
"""DDP agreeing through the process group at every size (``auto``: above 16 ranks)."""


class TestAgreementThroughTheProcessGroup(ConformanceSuite):
    strategies = (BACKEND_AGREEMENT,)
    world_sizes = (1, 2, 3, 4)
    max_examples = 60  # a fourth of the thorough profile: the same properties as ddp's


class TestMeshStrategiesOnTheirOwnMesh(ConformanceSuite, TrainingSuite):
    strategies = _proven(ON_A_MESH)
    world_sizes = (1, 3)  # 2 and 4: TestMeshDimensions, on given meshes
    training_examples = 2


class TestOneProcessStrategies(ConformanceSuite, TrainingSuite):
    strategies = _proven(ONE_PROCESS)
    world_sizes = (1,)
    training_examples = 3


def test_every_registered_strategy_is_run_or_excused() -> None:
    registered = set(StrategyRegistry.available_strategies())

    assert set(ONE_PROCESS) <= registered
    assert set(NOT_ON_CPU) <= registered
    assert {"ddp", "fsdp", "deepspeed"} <= set(MULTI_PROCESS)
    assert set(DDP_VARIANTS) <= registered
    assert set(FSDP_VARIANTS) <= registered
    assert set(DEEPSPEED_VARIANTS) <= registered
    assert set(OWN_COLLECTIVES) <= registered
    assert set(ON_A_MESH) <= registered
    assert set(DDP_OPTIONS) <= set(DDP_VARIANTS)
    # An alias is proven under the name it repeats, which is proven itself.
    assert {"modelparallelstrategy": "model_parallel"}.items() <= ALIASES.items()
    assert set(ALIASES.values()) <= set(MULTI_PROCESS) | set(LAUNCHED_ALIKE) | {
        name
        for names in (
            DDP_VARIANTS,
            FSDP_VARIANTS,
            DEEPSPEED_VARIANTS,
            ON_A_MESH,
            ONE_PROCESS,
            OWN_COLLECTIVES,
        )
        for name in _proven(names)
    }
    assert registered == (
        set(MULTI_PROCESS)
        | set(ON_A_MESH)
        | set(DDP_VARIANTS)
        | set(OWN_COLLECTIVES)
        | set(FSDP_VARIANTS)
        | set(DEEPSPEED_VARIANTS)
        | set(ONE_PROCESS)
        | set(NOT_ON_CPU)
        | set(ALIASES)
        | set(LAUNCHED_ALIKE)
    )


def test_a_name_launched_alike_is_its_proven_variant_under_another_launcher() -> None:
    for name, proven in LAUNCHED_ALIKE.items():
        entry, target = StrategyRegistry.entry(name), StrategyRegistry.entry(proven)
        settings = dict(entry.init_params)
        assert settings.pop("start_method") != target.init_params["start_method"], name
        assert (entry.factory, settings) == (
            target.factory,
            {k: v for k, v in target.init_params.items() if k != "start_method"},
        ), name
        assert proven in DDP_VARIANTS, name


MESH_STRATEGY: Final = f"{Path(__file__).with_name('mesh_strategies.py')}:model_parallel_on"
"""``model_parallel`` built on a given (dp, tp) or (pp, dp, cp, tp) mesh."""


class TestMeshDimensions(ConformanceSuite):
    """Every property over each dimension of ``model_parallel``'s mesh, on three shapes.

    The grid and 25 drawn examples over the job and over each dimension's groups
    (100 a property on each mesh): the collectives over a dimension are those the
    other lanes prove over the job and its sub-groups, with the thorough profile.
    (dp=2, tp=2), (dp=2) and (pp=2, cp=2): every dimension of the mesh is more than
    one rank on one of them (a group of four is the world lane's).
    """

    strategies = (MESH_STRATEGY,)
    world_sizes = (2, 4)
    meshes: ClassVar[dict[int, tuple[tuple[int, ...], ...]]] = {
        4: ((2, 2), (2, 1, 2, 1)),
        2: ((2, 1),),
    }
    max_examples = 25


class TestModelParallelTrainsOnMeshes(TrainingSuite):
    """The training properties of ``model_parallel`` over tensor, pipeline and context ranks.

    The kit's models parallelize themselves over the mesh (the strategy declares
    ``parallelized_by_module``): on (tp=2), (dp=2, tp=2), (pp=2), (pp=2, dp=2),
    (cp=2) and (dp=2, cp=2), the MLP and the convolution cut into two stages under a
    pipeline, the attention model's sequences split between the context-parallel
    ranks, and their checkpoints resized to 1 and 3 ranks on the strategy's own mesh.
    Data parallelism alone is `TestMeshStrategiesOnTheirOwnMesh`'s.
    """

    strategies = (MESH_STRATEGY,)
    world_sizes = (2, 4)
    meshes: ClassVar[dict[int, tuple[tuple[int, ...], ...]]] = {
        2: ((1, 2), (2, 1, 1, 1), (1, 1, 2, 1)),
        4: ((2, 2), (2, 2, 1, 1), (1, 2, 2, 1)),
    }
    training_examples = 2
    resize_world_sizes = (1, 3)
