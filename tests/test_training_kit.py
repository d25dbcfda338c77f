"""The training kit proves what strategies do to training, and it can fail.

A strategy of our own written from the guide (``examples/local_sgd.py``, local SGD
declared as `PeriodicAveraging`) passes every training property through the pytest
plugin, as a third party's would; each deliberately broken strategy of
``training_broken.py`` is caught, in every run (by the property's grid, whatever
the seed), by the property it breaks; examples the kit found once stay here as
regressions.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Final

import pytest

from plait.conformance import (
    TRAINING_PROPERTIES,
    ContractViolation,
    MoveViolation,
    RankPool,
    ReplicasCase,
    ResumeCase,
    RoundTripCase,
    TrainingRun,
    TrainingSuite,
    prove,
    prove_moves,
    reproduce,
)
from plait.core import PeriodicAveraging

HERE = Path(__file__).resolve().parent
BROKEN: Final = HERE / "training_broken.py"
LOCAL_SGD: Final = f"{HERE.parent / 'examples' / 'local_sgd.py'}:LocalSGDStrategy"
BY_NAME: Final = {prop.name: prop for prop in TRAINING_PROPERTIES}


class TestLocalSGDFromTheGuide(TrainingSuite):
    """The guide's strategy: replicas meeting every 4 steps, bit-for-bit resumes."""

    strategies = (LOCAL_SGD,)
    world_sizes = (1, 2, 3)
    training_examples = 3


class TestDiLoCoFromTheGuide(TrainingSuite):
    """The same strategy as DiLoCo every 4 steps: an outer Nesterov SGD, or an outer AdamW.

    The AdamW (weight decay, a halving schedule) is declared by its factories; the
    streaming form meets two fragments of the parameters staggered by 2 steps.
    """

    strategies = (f"{BROKEN}:DiLoCo", f"{BROKEN}:DiLoCoAdamW", f"{BROKEN}:StreamingDiLoCo")
    world_sizes = (2,)
    training_examples = 2


CAUGHT: Final = [
    ("NeverSynchronises", "declared_semantics", 2, "the run matches replicas that never meet"),
    ("SynchronisesEveryOtherStep", "declared_semantics", 2, "is not what one process"),
    ("AveragesOverTheWrongGroup", "declared_semantics", 3, "is not what one process"),
    ("DropsOptimizerState", "checkpoint_round_trip", 2, "optimizer's state['state']: the keys"),
    (
        "StopsBroadcastingBuffers",
        "declared_semantics",
        2,
        "they are what buffers='own' gives (each rank keeps its own)",
    ),
    ("TurnsKeysIntoStrings", "checkpoint_round_trip", 2, "came back as strings"),
    ("StepsSchedulersAgainOnLoad", "resume_exactness", 2, "the run never stopped"),
    ("StepsSchedulersAgainOnLoad", "checkpoint_round_trip", 1, "scheduler"),
    (
        "KeepsRankZerosReplica",
        "checkpoint_round_trip",
        2,
        "rank 1: after a save and a load, module",
    ),
    # ModelParallelStrategy, the module parallelizing itself (two tensor-parallel ranks).
    ("MeshLaysOutNoMesh", "declared_semantics", 2, "one process on the global batch of the 2"),
    (
        "DeclaresItsModuleParallelizesItself",
        "declared_semantics",
        1,
        "has no device_mesh and data_parallel_mesh",
    ),
    ("MeshLoadsTheModulesAlone", "checkpoint_round_trip", 2, "optimizer"),
    # ... and spreading the kit's models over two pipeline stages.
    ("PipelineMissesALayer", "declared_semantics", 2, "every rank: the loss of step 0"),
    ("PipelineStageSkipsItsBackward", "declared_semantics", 2, "every rank: the loss of step 1"),
    # ... and splitting the attention model's sequences over two context-parallel ranks.
    ("ContextShardsOverDataOnly", "declared_semantics", 2, "global batch of the one rank"),
    ("ContextMasksInLocalOrder", "declared_semantics", 2, "every rank: the loss of step 0"),
    # DiLoCo (every 4 steps, an outer Nesterov step): the runs reach its meetings
    # whatever the period, and the message names the flaw.
    ("DiLoCoNeverMeets", "declared_semantics", 2, "the run matches replicas that never meet"),
    (
        "DiLoCoMeetsEveryOtherPeriod",
        "declared_semantics",
        2,
        "the run matches replicas meeting every 8 steps, not 4",
    ),
    ("DiLoCoOuterStepUp", "declared_semantics", 2, "the run matches an outer step of the wrong"),
    (
        "DiLoCoForgetsOuterMomentumOnSave",
        "resume_exactness",
        2,
        "it went on alike until that meeting",
    ),
    (
        "DiLoCoKeepsItsMomentumOnLoad",
        "checkpoint_round_trip",
        2,
        "the strategy's own state['local_sgd']['momentum']",
    ),
    (
        "DiLoCoValidatesItsOwnReplica",
        "declared_semantics",
        2,
        "is not the replicas' mean (validates='mean' declared): it validated its own replica",
    ),
    (
        "DiLoCoTrainsOnFromTheValidatedMean",
        "declared_semantics",
        2,
        "rank 0: its module after step 5 is not what 2 replicas",
    ),
    (
        "DiLoCoAdamWMadeAnewAtEachMeeting",
        "declared_semantics",
        2,
        "the run matches an outer optimizer made anew at each meeting",
    ),
    (
        "StreamingDiLoCoMeetingAllAtOnce",
        "declared_semantics",
        2,
        "the run matches every fragment meeting at once every 4 steps",
    ),
    (
        "DiLoCoPerGroupMeetingTogether",
        "declared_semantics",
        2,
        (
            "the run matches every parameter group meeting every 4 steps (not each at its own "
            "period of 2, 4)"
        ),
    ),
    (
        "DiLoCoLoadsRankZerosModuleAlone",
        "checkpoint_round_trip",
        2,
        "rank 1: load_checkpoint(path, module) did not restore this rank's own module",
    ),
]
"""Each broken strategy, the property that catches it, where, and what it says."""


@pytest.mark.slow
@pytest.mark.parametrize(("flaw", "property_name", "world_size", "problem"), CAUGHT)
def test_every_broken_strategy_is_caught_in_every_run_by_the_property_it_breaks(
    flaw: str, property_name: str, world_size: int, problem: str
) -> None:
    with (
        RankPool(f"{BROKEN}:{flaw}", world_size=world_size, deadline=60) as pool,
        pytest.raises(ContractViolation) as caught,
    ):
        prove(pool, BY_NAME[property_name], max_examples=2, seed=0)
    violation = caught.value
    message = str(violation)
    assert violation.property == property_name
    # The grid caught it: every run tries it first, whatever the seed.
    assert violation.explicit, message
    assert problem in message, message
    assert "reproduce(" in message
    assert "Case(run=TrainingRun(" in message


@pytest.mark.slow
def test_a_resizable_strategy_that_goes_on_wrong_at_another_world_size_is_caught() -> None:
    spec = f"{BROKEN}:AveragesOverItsSavedWorldSize"
    with (
        RankPool(spec, world_size=2, deadline=60) as pool,
        RankPool(spec, world_size=3, deadline=60) as bigger,
        pytest.raises(MoveViolation) as caught,
    ):
        prove_moves(
            pool,
            lambda name: pytest.fail(f"no strategy is declared compatible, and {name} was asked"),
            max_examples=2,
            seed=0,
            resized_pool=lambda world_size: bigger,
            resize_to=[3],
        )
    violation = caught.value
    message = str(violation)
    assert violation.explicit, message  # the grid's move, whatever the seed
    assert "at 3 ranks, going on from its checkpoint of 2 ranks (saved after 1 step)" in message
    assert "one process on the global batch of the 3 ranks from the saved state" in message
    assert "moved_world_size=3)" in message  # the snippet reruns the resize


@pytest.mark.slow
def test_a_strategy_of_a_file_that_declares_factories_reruns_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Found by rerunning a printed snippet: the semantics the ranks sent named the outer
    # optimizer's factory in the file's module, which this process had not loaded.
    loaded = "_plait_conformance_target_" + re.sub(r"\W", "_", str(BROKEN))
    monkeypatch.delitem(sys.modules, loaded, raising=False)
    run = TrainingRun("mlp", 7, micro_batch=2, accumulate=1, steps=9, steps_per_epoch=2)
    case = RoundTripCase(run, stop_at=5, checkpoint_io="distributed")

    reproduce(f"{BROKEN}:DiLoCoAdamW", case, world_size=2, deadline=60)


@pytest.mark.slow
def test_a_strategy_that_refuses_every_example_proves_nothing_and_fails_saying_so() -> None:
    with (
        RankPool(f"{BROKEN}:RefusesEverything", world_size=1, deadline=60) as pool,
        pytest.raises(ContractViolation) as caught,
    ):
        prove(pool, BY_NAME["declared_semantics"], max_examples=3, seed=0, grid=False)
    message = str(caught.value)
    assert "refused every one of the" in message, message
    assert "RefusesEverything takes no module" in message


@pytest.mark.slow
def test_ddp_sharded_resumes_through_a_distributed_checkpoint() -> None:
    # Found by the kit: its optimizer's state, consolidated on rank 0 alone, lost its
    # structure in a checkpoint every rank writes (KeyError: 'param_groups').
    run = TrainingRun("mlp", 0, micro_batch=1, accumulate=1, steps=2, steps_per_epoch=1)
    case = ResumeCase(run, stop_at=1, checkpoint_io="distributed")

    reproduce("ddp_sharded", case, world_size=2, deadline=60)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "model_parallel"])
def test_a_sharded_strategy_trains_batch_norm_and_checkpoints_rank_zeros_buffers(
    strategy: str,
) -> None:
    # Found by the kit's model with buffers: FSDP's bfloat16 parameters met batch
    # norm's float32 running statistics (a RuntimeError at the first forward), and a
    # sharded checkpoint refused the ranks' buffers, which differ ("cannot be written:
    # the ranks hold different values").
    precision = "bf16-mixed" if strategy == "fsdp" else "32-true"
    run = TrainingRun(
        "norm", 3, micro_batch=2, accumulate=2, steps=3, steps_per_epoch=2,
        optimizer="adam", precision=precision,
    )  # fmt: skip
    for case in (
        ReplicasCase(run),
        RoundTripCase(run, stop_at=2),
        ResumeCase(run, stop_at=2),
    ):
        reproduce(strategy, case, world_size=2, deadline=60)


@pytest.mark.slow
def test_a_period_per_parameter_group_is_declared_and_proven() -> None:
    # DiLoCo whose first half of the parameters meets every 2 steps, the second every
    # 4: the runs reach two meetings of the longest period, and stop inside it.
    with RankPool(f"{BROKEN}:DiLoCoPerGroup", world_size=2, deadline=60) as pool:
        for name in ("declared_semantics", "checkpoint_round_trip", "resume_exactness"):
            assert prove(pool, BY_NAME[name], max_examples=2, seed=0) >= 2
        assert pool.semantics.replicas == PeriodicAveraging(
            every=4, outer_lr=0.7, outer_momentum=0.9, nesterov=True, validates="mean",
            periods=(2, 4),
        )  # fmt: skip
