"""ModelParallelStrategy: a transformer block split over a (dp, tp) mesh trains as one
process does, reads its data by its data-parallel coordinates, and its checkpoint
resumes on every other mesh shape (``model_parallel_job.py``, a loop of the user's own);
a decoder block with context-parallel attention on (dp, cp) does the same
(``context_parallel_job.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tests import warm
from tests.processes import processes_mentioning
from tests.sharded_jobs import assert_losses_close

from plait.core import ConfigurationError, StrategyRegistry
from plait.strategies import ModelParallelStrategy
from plait.strategies.pipeline import SCHEDULES

JOB = Path(__file__).resolve().with_name("model_parallel_job.py")
JOB_TIMEOUT = 300

# pytest's own bound (120 s) is for a test in one process. The module's job is bounded
# by its timeout, and pytest's bound is a minute more, so that a job that runs long is
# stopped and reported with its output.
pytestmark = pytest.mark.timeout(JOB_TIMEOUT + 60)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """The job once: the plain run, 2x2, the resumed 4x1, 1x4 and 1x1 runs, and both in bf16."""
    root = tmp_path_factory.mktemp("model-parallel")
    done = warm.run(JOB, [str(root)], timeout=JOB_TIMEOUT)
    assert not processes_mentioning(str(root)), "a rank was left running"
    assert done.returncode == 0, done.stderr[-6000:]
    results: dict[str, dict[str, object]] = json.loads((root / "results.json").read_text())
    return results


def _losses(run: object) -> dict[str, float]:
    assert isinstance(run, dict)
    losses: dict[str, float] = run.get("losses", run)
    return losses


@pytest.mark.slow
def test_a_2x2_mesh_trains_a_transformer_block_as_one_process_does(
    runs: dict[str, dict[str, object]],
) -> None:
    # Tensor parallel on the linear layers, sequence parallel on the norms, FSDP over
    # the data-parallel ranks: the same losses as the unsplit model, step by step.
    assert_losses_close(_losses(runs["2x2"]), _losses(runs["plain"]), 1e-5)


@pytest.mark.slow
def test_in_bf16_mixed_a_2x2_mesh_trains_as_one_process_under_the_same_autocast(
    runs: dict[str, dict[str, object]],
) -> None:
    # bf16 keeps 8 bits of mantissa: the split matmuls round their partial sums where
    # one process rounds the whole, about 4e-3 of a value each time. The precision
    # took effect: the losses are not the float32 run's.
    bf16, plain = _losses(runs["2x2-bf16"]), _losses(runs["plain-bf16"])
    assert bf16.keys() == plain.keys() == _losses(runs["plain"]).keys()
    for step, loss in plain.items():
        assert bf16[step] == pytest.approx(loss, rel=1e-2), step
    assert max(abs(bf16[step] - value) for step, value in _losses(runs["2x2"]).items()) > 1e-4
    assert bf16[str(len(bf16) - 1)] < bf16["0"] / 2  # it learns


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["4x1", "1x4", "1x1"])
def test_a_checkpoint_saved_on_2x2_resumes_on_another_mesh_shape(
    runs: dict[str, dict[str, object]], shape: str
) -> None:
    # Saved through DCP after step 3 on (dp=2, tp=2), every rank writing its shards;
    # loaded on (dp=4, tp=1), (dp=1, tp=4) and one process: the next losses are the
    # uninterrupted run's.
    uninterrupted = {step: v for step, v in _losses(runs["2x2"]).items() if int(step) >= 3}
    assert_losses_close(_losses(runs[shape]), uninterrupted, 1e-5)
    # Before that, the module alone: its shards restored (the outputs the whole
    # state then gives), the optimizer as it was, and only the run's entry back.
    assert runs[shape]["alone"] == {"left": ["step"], "untouched": True, "module": True}


@pytest.mark.slow
def test_the_ranks_of_a_tensor_parallel_group_read_the_same_batches(
    runs: dict[str, dict[str, object]],
) -> None:
    # Rows: global ranks 0-3, as [dp rank, dp size, tp rank, tp size].
    assert runs["2x2"]["layouts"] == [[0, 2, 0, 2], [0, 2, 1, 2], [1, 2, 0, 2], [1, 2, 1, 2]]
    assert runs["4x1"]["layouts"] == [[rank, 4, 0, 1] for rank in range(4)]
    assert runs["1x4"]["layouts"] == [[0, 1, rank, 4] for rank in range(4)]
    # What each rank's last batch summed to: alike within a tensor-parallel group.
    two = runs["2x2"]["batches"]
    assert isinstance(two, list)
    assert two[0] == two[1] != two[2] == two[3]
    four, one = runs["4x1"]["batches"], runs["1x4"]["batches"]
    assert isinstance(four, list)
    assert isinstance(one, list)
    assert len(set(four)) == 4
    assert len(set(one)) == 1
    # Without context parallelism the mesh is the 3-D one it always was.
    assert runs["2x2"]["dimensions"] == ["dp_replicate", "dp_shard", "tp"]
    # reduce(group="tp") sums within the group: 0+1 on ranks 0 and 1 (2x2).
    assert runs["2x2"]["tp_sum"] == 1
    assert runs["4x1"]["tp_sum"] == 0


@pytest.mark.slow
def test_a_module_not_parallelized_over_the_mesh_is_refused_with_the_fix(
    runs: dict[str, dict[str, object]],
) -> None:
    refused = runs["2x2"]["refused"]
    assert isinstance(refused, dict)
    assert "FeedForward that nothing parallelized" in refused["plain"]
    assert "configure_model" in refused["plain"]
    # Tensor parallel alone, on 2 data-parallel ranks: nothing would average the
    # gradients between them.
    assert (
        "not sharded over the mesh's data-parallel dimensions ['dp_shard']"
        in refused["tensor_only"]
    )
    assert "fully_shard" in refused["tensor_only"]
    assert "invalid group: 'pd'" in refused["group"]
    assert "'tp'" in refused["group"]


@pytest.mark.slow
def test_context_parallel_attention_is_whole_sequence_attention_and_a_local_mask_is_not(
    runs: dict[str, dict[str, object]],
) -> None:
    # float64, on each of the 2 cp ranks of both cp groups: outputs and the gradients
    # of the rank's queries, keys and values, contiguous and load-balanced slices.
    errors = runs["context"]["attention"]
    assert isinstance(errors, dict)
    for check in ("causal-contiguous", "causal-balanced", "full-contiguous", "full-balanced"):
        assert errors[check] < 1e-12, check
    # The broken control: a causal mask over the rank's own load-balanced slice
    # attends to the wrong tokens, and the check sees it.
    assert errors["plain-mask-balanced"] > 0.1


@pytest.mark.slow
def test_a_dp_x_cp_mesh_trains_a_decoder_as_one_process_does_and_resumes_on_one(
    runs: dict[str, dict[str, object]],
) -> None:
    # FSDP over dp_shard_cp, the loss of every token averaged over dp_cp: the losses
    # of the same model and steps with no strategy at all.
    trained = _losses(runs["context"])
    assert_losses_close(trained, _losses(runs["context-plain"]), 1e-5)
    # Saved through DCP after step 3 on (dp=2, cp=2); loaded in one process, where
    # the attention is plain: the next losses are the uninterrupted run's.
    uninterrupted = {step: v for step, v in trained.items() if int(step) >= 3}
    assert_losses_close(_losses(runs["context-1x1"]), uninterrupted, 1e-5)
    # Rows: global ranks 0-3, as [dp rank, cp rank, the positions of its tokens]. The
    # ranks of a cp group read the same samples, each its load-balanced chunks.
    assert runs["context"]["places"] == [
        [0, 0, 0, 1, 6, 7], [0, 1, 2, 3, 4, 5], [1, 0, 0, 1, 6, 7], [1, 1, 2, 3, 4, 5],
    ]  # fmt: skip
    assert runs["context-1x1"]["places"] == [[0, 0, *range(8)]]
    assert runs["context"]["dimensions"] == ["dp_replicate", "dp_shard", "cp", "tp"]
    assert runs["context"]["fsdp_mesh"] == ["dp_shard_cp"]


@pytest.mark.slow
def test_hybrid_sharding_with_context_parallelism_trains_as_one_process_does(
    runs: dict[str, dict[str, object]],
) -> None:
    # (dp_replicate=2, dp_shard=1, cp=2): FSDP over the 2-D (dp_replicate,
    # dp_shard_cp) mesh, each replica's cp ranks summing their gradients.
    assert runs["context-hsdp"]["fsdp_mesh"] == ["dp_replicate", "dp_shard_cp"]
    assert_losses_close(_losses(runs["context-hsdp"]), _losses(runs["context-plain"]), 1e-5)


@pytest.mark.slow
def test_context_parallelism_refuses_unsummed_gradients_and_a_mask_without_positions(
    runs: dict[str, dict[str, object]],
) -> None:
    refused = runs["context"]["refused"]
    assert isinstance(refused, dict)
    # FSDP over dp_shard alone with cp = 2: the cp ranks' gradients never summed.
    assert "not sharded over a mesh that includes cp" in refused["dp_shard_only"]
    assert "strategy.data_parallel_mesh" in refused["dp_shard_only"]
    assert "needs each token's global position" in refused["no_positions"]
    assert "positions=strategy.sequence_positions" in refused["no_positions"]
    assert "length 6 does not split into 4 equal load-balanced chunks" in refused["uneven"]
    assert "context_parallel_load_balancing=False" in refused["uneven"]


@pytest.mark.slow
def test_every_pipeline_schedule_trains_as_one_process_does_and_evaluates_or_refuses(
    runs: dict[str, dict[str, object]],
) -> None:
    # pp = 2 on 2 ranks, every torch schedule (one, two, or V-shaped stages per rank):
    # the losses of the same model and batches in one process, on every rank.
    plain = _losses(runs["pp-plain"])
    trained = runs["pp-schedules"]
    for name in SCHEDULES:
        losses = trained[name]
        assert isinstance(losses, dict)
        assert losses["stages"] == (1 if name in {"GPipe", "1F1B"} else 2), name
        steps = {step: value for step, value in losses.items() if step.isdigit()}
        assert_losses_close(steps, {step: plain[step] for step in steps}, 1e-5)
        if name in {"ZBVZeroBubble", "DualPipeV"}:
            # No forward-only path: refused on every rank before torch's fails on
            # one and leaves the other waiting.
            refused = trained[f"eval-refused-{name}"]
            assert isinstance(refused, str)
            assert f"the {name} schedule cannot run forward only" in refused
            assert "pipeline_schedule='1F1B'" in refused
        else:
            assert losses["eval"] == pytest.approx(plain["eval"], abs=1e-5), name
    # The loss of the last stage reached the first stage's rank too.
    everywhere = trained["losses_everywhere"]
    assert isinstance(everywhere, list)
    assert len(everywhere) == 2
    assert all(row[0] == pytest.approx(plain["0"], abs=1e-5) for row in everywhere)


@pytest.mark.slow
def test_clipping_under_a_pipeline_takes_the_norm_over_every_stage(
    runs: dict[str, dict[str, object]],
) -> None:
    # Each rank holds half the gradients: the norm is summed over pp before clipping,
    # so the norms, and the clipped steps, are one process's.
    clipped = _losses(runs["pp-schedules"]["clipped"])
    plain = _losses(runs["pp-plain-clipped"])
    for step in range(3):
        assert clipped[f"norm-{step}"] == pytest.approx(plain[f"norm-{step}"], rel=1e-5)
        assert clipped[f"clipped-{step}"] == pytest.approx(0.05, rel=1e-4)
        assert clipped[str(step)] == pytest.approx(plain[str(step)], abs=1e-5)


@pytest.mark.slow
def test_a_stage_that_skips_its_backward_is_told_apart_from_one_process(
    runs: dict[str, dict[str, object]],
) -> None:
    # The broken control: the second stage detaches its input, so the first never
    # learns; the same comparison that passes every schedule sees it.
    broken = _losses(runs["pp-broken"])
    plain = _losses(runs["pp-plain"])
    assert max(abs(broken[step] - plain[step]) for step in broken) > 1e-3


@pytest.mark.slow
def test_pipelines_with_fsdp_or_tensor_parallelism_train_and_resume_in_other_layouts(
    runs: dict[str, dict[str, object]],
) -> None:
    plain = _losses(runs["pp-plain"])
    steps = {step: value for step, value in plain.items() if step.isdigit()}
    later = {step: value for step, value in steps.items() if int(step) >= 3}
    # pp = 2 x dp = 2 (FSDP on each stage) and pp = 2 x tp = 2: one process's losses.
    assert_losses_close(_losses(runs["pp-fsdp"]), steps, 1e-5)
    assert_losses_close(_losses(runs["pp-tp"]), steps, 1e-5)
    assert runs["pp-fsdp"]["dimensions"] == ["pp", "dp_replicate", "dp_shard", "tp"]
    # Rows: global ranks 0-3 as [dp rank, pp rank, the stage held]: pp outermost.
    assert runs["pp-fsdp"]["places"] == [[0, 0, 0], [1, 0, 0], [0, 1, 1], [1, 1, 1]]
    # The checkpoint saved per stage after step 3, keyed by the whole model's names:
    # into 4 interleaved stages on 2 ranks, and into the whole model in one process.
    assert runs["pp-resume"]["stages"] == [0, 2]
    assert_losses_close(_losses(runs["pp-resume"]), later, 1e-5)
    assert_losses_close(_losses(runs["pp-1x1"]), later, 1e-5)
    assert_losses_close(_losses(runs["pp-tp-1x1"]), later, 1e-5)
    # consolidate_checkpoint gives the whole model: the tensors one process loaded.
    assert runs["pp-1x1"]["consolidated_whole"] is True
    assert runs["pp-tp-1x1"]["consolidated_whole"] is True
    # And into plain DDP on 2 ranks, whose optimizer takes the groups by position:
    # every stage's parameters are listed in the checkpoint's groups.
    assert_losses_close(_losses(runs["pp-ddp"]), later, 1e-5)


@pytest.mark.slow
def test_a_pipeline_of_context_parallel_decoder_blocks_trains_as_one_process_does(
    runs: dict[str, dict[str, object]],
) -> None:
    # pp = 2 x cp = 2: each stage's attention over its cp group, the tokens'
    # positions passed to every stage as a keyword, FSDP over dp_shard_cp.
    assert_losses_close(_losses(runs["pp-cp"]), _losses(runs["pp-cp-plain"]), 1e-5)
    assert runs["pp-cp"]["dimensions"] == ["pp", "dp_replicate", "dp_shard", "cp", "tp"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size=0 is neither a positive int"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size=True is neither"),
        ({"data_parallel_size": "two"}, "data_parallel_size='two' is neither"),
        ({"data_parallel_replicate_size": "auto"}, "takes a positive int, not 'auto'"),
        (
            {"data_parallel_size": 4, "data_parallel_replicate_size": 3},
            "data_parallel_replicate_size=3 does not divide data_parallel_size=4",
        ),
        ({"checkpoint_io": "torch"}, "every rank write its shards"),
        ({"start_method": "thread"}, "start_method"),
        ({"context_parallel_size": 0}, "context_parallel_size=0 is neither a positive int"),
        ({"context_parallel_size": "auto"}, "context_parallel_size takes a positive int"),
        ({"context_parallel_load_balancing": 1}, "context_parallel_load_balancing=1 is not"),
    ],
)
def test_bad_options_are_refused_when_the_strategy_is_made(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ModelParallelStrategy(accelerator="cpu", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tensor_parallel_size": 2}, "tensor_parallel_size=2 does not divide the world of 1"),
        ({"data_parallel_size": 2}, "data_parallel_size=2 does not divide the world of 1"),
        (
            {"data_parallel_size": 1, "tensor_parallel_size": 2},
            r"data_parallel_size=1 x tensor_parallel_size=2 is 2 ranks, and the world has 1",
        ),
        ({"context_parallel_size": 2}, "context_parallel_size=2 does not divide the world of 1"),
    ],
)
def test_sizes_that_do_not_make_the_world_are_refused_naming_both(
    options: dict[str, object], message: str
) -> None:
    strategy = ModelParallelStrategy(accelerator="cpu", **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=message):
        _ = strategy.mesh_shape


def test_one_process_is_a_mesh_of_one_and_the_registry_names_the_strategy() -> None:
    strategy = ModelParallelStrategy(accelerator="cpu")
    shape = strategy.mesh_shape
    assert (shape.replicate, shape.shard, shape.tensor) == (1, 1, 1)
    layout = strategy.layout
    assert (layout.data_parallel_size, layout.tensor_parallel_size) == (1, 1)
    for name in ("model_parallel", "ModelParallelStrategy"):
        assert isinstance(StrategyRegistry.get(name, accelerator="cpu"), ModelParallelStrategy)


@pytest.mark.slow
def test_a_pipelines_sharded_checkpoint_holds_each_stages_first_ranks_buffers(
    runs: dict[str, dict[str, object]],
) -> None:
    # pp = 2 x dp = 2, batch norm in the second stage (ranks 2 and 3): each rank's
    # running statistics are its own rows', which a sharded checkpoint writes once.
    # Found by the training kit's model with buffers: the write was refused.
    before, after = runs["pp-norm"]["before"], runs["pp-norm"]["after"]
    assert isinstance(before, list)
    assert isinstance(after, list)
    assert before[0] == before[1] == [], "the first stage holds no batch norm"
    # The batch norm counted each micro-batch once: not the forward the schedule runs
    # (on uninitialized tensors past the first stage) to learn the stages' shapes.
    forwards = runs["pp-norm"]["microbatch_forwards"]
    assert runs["pp-norm"]["tracked"] == [0, 0, forwards, forwards]
    assert all(math.isfinite(value) for value in [*before[2], *before[3]]), before
    assert before[2] != before[3], "the data-parallel ranks' statistics differ"
    assert after == [[], [], before[2], before[2]]
