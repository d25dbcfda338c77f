"""The Trainer on two gloo processes: real ranks, started by plait's launchers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tests import warm
from tests.processes import processes_mentioning

JOB = Path(__file__).resolve().parent / "trainer_job.py"


def _run(
    tmp_path: Path,
    scenario: str,
    strategy: str = "ddp",
    devices: int = 2,
    *,
    launcher: bool = False,
) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    arguments = [
        *("--strategy", strategy, "--devices", str(devices)),
        *("--scenario", scenario, "--root", str(tmp_path)),
    ]
    if not launcher:
        arguments += ["--start-method", "fork"]
    # The job starts warm (`tests.warm`). Where the launcher is what a test is about
    # (``launcher=True``), the ranks start as it starts them (a new interpreter each,
    # under popen and spawn); elsewhere they are forks of the job's process, which
    # has imported torch and plait already.
    completed = warm.run(JOB, arguments, timeout=150)
    assert not processes_mentioning(str(tmp_path)), "a rank was left running"
    result_file = tmp_path / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    return completed, result


@pytest.mark.slow
def test_a_cluster_environment_and_accelerator_written_as_in_lightning_train_on_spawned_ranks(
    tmp_path: Path,
) -> None:
    # Methods where plait has properties, counts where plait has indices: adapted, and
    # each spawned rank's environment told its place, as Lightning tells it.
    completed, result = _run(tmp_path, "lightning_parts", "ddp_spawn", launcher=True)

    assert completed.returncode == 0, completed.stderr
    assert result["places"] == [[2, 0, "cpus_by_count"], [2, 1, "cpus_by_count"]]
    # One MLflow run, made by rank 0, with a loss for each of the 5 steps, finished.
    assert result["mlflow_runs"] == [["FINISHED", 5]]


@pytest.mark.slow
def test_fit_on_two_ranks_syncs_metrics_without_truncating_and_every_launcher_runs_alike(
    tmp_path: Path,
) -> None:
    runs = {}
    for strategy in ("ddp", "ddp_spawn"):
        root = tmp_path / strategy
        root.mkdir()
        completed, result = _run(root, "fit", strategy, launcher=True)

        assert completed.returncode == 0, completed.stderr
        metrics = result["metrics"]
        assert isinstance(metrics, dict)
        assert result["global_step"] == 2 * 5  # 40 samples, 2 ranks, batches of 4
        assert metrics["train_seen"] == 40  # each sample once per epoch, counted over ranks
        assert metrics["val_seen"] == 21  # every validation sample exactly once, none repeated
        assert metrics["rank_mean"] == 0.5  # the mean of ints 0 and 1
        assert metrics["weights_max"] == metrics["weights_min"]  # the replicas agree
        # After fit, each process still answers for the job it ran: size, nodes and rank.
        jobs = {path.name: json.loads(path.read_text()) for path in root.glob("job-*.json")}
        expected = {"job-0.json": [2, 1, 0]}
        if strategy == "ddp":  # rank 1 runs the script too
            expected["job-1.json"] = [2, 1, 1]
        assert jobs == expected
        # trainer.model is the module as the strategy wrapped it, on every rank.
        wrapped = {path.name: path.read_text() for path in root.glob("model-*.txt")}
        # A rank's strategy says the job's world size (the caller's, under ddp_spawn,
        # is no rank).
        said = "ddp=True DDPStrategy(backend='gloo', world_size=2, device='cpu')"
        assert wrapped == dict.fromkeys(("model-0.txt", "model-1.txt"), said)
        # A test after the fit adds its row below the fit's rows, in the same file.
        logged = result["logged"]
        assert isinstance(logged, list)
        assert any("train_seen" in row for row in logged[:-1]), logged
        assert any("val_seen" in row for row in logged[:-1]), logged
        assert any("test_loss" in row for row in logged[-1:]), logged
        # Each rank profiled its own steps.
        for rank in (0, 1):
            report = (root / "profiles" / f"fit-rank{rank}-simple.txt").read_text()
            assert "training_step" in report
        runs[strategy] = result
    # The same seed, the same run: the model has dropout, so the ranks' random states
    # count, and spawned ranks start where the caller's program stood.
    assert runs["ddp"]["weights"] == runs["ddp_spawn"]["weights"]
    assert runs["ddp"]["metrics"] == runs["ddp_spawn"]["metrics"]


def _same_as_one_process(
    tmp_path: Path,
    scenario: str,
    strategies: list[str],
    steps: int,
    tolerance: float = 1e-6,
    *,
    launcher: bool = False,
) -> None:
    # The scenario takes 8 samples a step, in order, split over 2 ranks or not at all:
    # each strategy must reach the weights one process reaches.
    states = {}
    for strategy, devices in (("single_device", 1), *((name, 2) for name in strategies)):
        root = tmp_path / strategy
        root.mkdir()
        completed, result = _run(root, scenario, strategy, devices, launcher=launcher)
        assert completed.returncode == 0, completed.stderr
        assert result["global_step"] == steps
        states[strategy] = result["state"]
    one = states.pop("single_device")
    assert isinstance(one, dict)
    for strategy, state in states.items():
        assert isinstance(state, dict)
        assert state.keys() == one.keys()
        for name, values in one.items():
            assert state[name] == pytest.approx(values, abs=tolerance), (strategy, name)


@pytest.mark.slow
def test_a_gan_stepping_its_own_optimizers_trains_on_ddp_and_fsdp_as_on_one_process(
    tmp_path: Path,
) -> None:
    # Two optimizers stepped by hand, one toggled, the other accumulating two batches
    # by hand; each optimizer step counts (5 + 3 an epoch).
    strategies = ["ddp_find_unused_parameters_true", "fsdp"]
    _same_as_one_process(tmp_path, "gan", strategies, steps=2 * (5 + 3))


@pytest.mark.slow
def test_a_step_by_hand_on_deepspeed_goes_through_the_engine_as_on_one_process(
    tmp_path: Path,
) -> None:
    _same_as_one_process(tmp_path, "by_hand", ["deepspeed_stage_3"], steps=2 * 5)


@pytest.mark.slow
def test_lbfgs_evaluating_its_step_again_and_again_trains_on_ddp_as_on_one_process(
    tmp_path: Path,
) -> None:
    # Each rank's closure returns the loss averaged over the ranks: they decide alike.
    # LBFGS divides by curvatures it estimates, which carries rounding further: the
    # scenario trains in float64, where the ranks' order of summing stays far below this.
    _same_as_one_process(tmp_path, "lbfgs", ["ddp"], steps=2 * 5, tolerance=1e-9)


@pytest.mark.slow
def test_a_module_that_parallelizes_itself_in_configure_model_trains_as_on_one_process(
    tmp_path: Path,
) -> None:
    # model_parallel on 2 processes lays out (dp=1, tp=2); the module's configure_model
    # splits its layers over mesh["tp"] and shards over mesh["dp_shard"]. Its sharded
    # checkpoint loads into one process (load_from_checkpoint) with the weights one
    # process reaches.
    # The module fit trained is the caller's (rank 0's, under popen): its checkpoint
    # is read back in this process.
    _same_as_one_process(
        tmp_path, "tensor_parallel", ["model_parallel"], steps=2 * 5, launcher=True
    )
    # sync_dist folds over the data-parallel ranks: the 40 samples of an epoch count
    # once, not once per tensor-parallel rank.
    for strategy in ("single_device", "model_parallel"):
        result = json.loads((tmp_path / strategy / "result.json").read_text())
        assert result["metrics"]["samples_epoch"] == 40, strategy


@pytest.mark.slow
def test_layers_made_in_configure_model_on_a_mesh_start_on_meta_and_keep_training(
    tmp_path: Path,
) -> None:
    # Made on the meta device, parallelized there, then each rank materialises (and
    # initialises) only its shards; a second fit of the same object goes on from them.
    completed, result = _run(tmp_path, "made_on_the_mesh", "model_parallel", launcher=True)

    assert completed.returncode == 0, completed.stderr
    assert result["made_on"] == "meta"
    assert result["global_step"] == [3 * 5, 3 * 5]  # two fits of 3 epochs, 5 steps each
    first, after = result["loss_epoch"], result["loss_after"]
    assert isinstance(first, float)
    assert isinstance(after, float)
    assert after < first
    # Resolved once when each rank joined, and kept after the runs: both ranks answer
    # the job's (dp=1, tp=2).
    for rank in (0, 1):
        answer = json.loads((tmp_path / f"mesh-after-{rank}.json").read_text())
        assert answer == {
            "mesh": {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 2},
            "world": 2,
        }


@pytest.mark.slow
def test_a_module_that_does_not_parallelize_itself_on_a_mesh_is_refused_by_name(
    tmp_path: Path,
) -> None:
    completed, _ = _run(tmp_path, "not_parallelized", "model_parallel")

    assert completed.returncode != 0
    assert "got a Toy that nothing parallelized" in completed.stderr
    assert "configure_model (self.device_mesh)" in completed.stderr


@pytest.mark.slow
def test_a_module_compiled_in_each_rank_trains_on_ddp_and_fsdp_as_on_one_process(
    tmp_path: Path,
) -> None:
    _same_as_one_process(tmp_path, "compiled", ["ddp", "fsdp"], steps=2 * 5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", ["ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3", "model_parallel"]
)
def test_the_module_fit_left_goes_on_to_every_stage_as_a_fresh_one_from_its_checkpoint(
    tmp_path: Path, strategy: str
) -> None:
    # fit, then validate, test, predict and a second Trainer's fit, on the module
    # object as the strategy left it (sharded, partitioned), in the same job.
    completed, result = _run(tmp_path, "goes_on", strategy, launcher=True)

    assert completed.returncode == 0, completed.stderr
    same, fresh = result["same"], result["fresh"]
    assert isinstance(same, dict)
    assert isinstance(fresh, dict)
    assert same.keys() == {"validate", "test", "predict", "fit_again"}
    for stage, value in same.items():
        assert value == pytest.approx(fresh[stage], abs=1e-6), stage
    # The second fit trained on from the first's weights.
    assert same["fit_again"] != pytest.approx(same["validate"], abs=1e-6)
    # After any call, the trainer describes the job it ran in.
    assert result["job"] == [2, 1, 0, True]
    # The optimizer is the one the scheduler was made over: torch has nothing to say.
    assert "overridden after learning rate scheduler" not in completed.stderr


@pytest.mark.slow
def test_a_module_sharded_in_a_job_that_ended_is_refused_with_the_fix(tmp_path: Path) -> None:
    completed, result = _run(tmp_path, "after_the_job", "fsdp", launcher=True)

    assert completed.returncode == 0, completed.stderr
    error = result["error"]
    assert isinstance(error, str)
    assert "sharded in an earlier job of this program" in error
    assert "keep the job's process group" in error
    assert "load the checkpoint into it" in error


@pytest.mark.slow
def test_a_step_by_hand_on_fsdp_asks_for_its_parameters_in_blocks(tmp_path: Path) -> None:
    completed, _ = _run(tmp_path, "gan_root_only", "fsdp")

    assert completed.returncode != 0
    assert "manual optimization on FSDP needs every parameter in a block" in completed.stderr
    assert "auto_wrap_policy" in completed.stderr


@pytest.mark.slow
def test_uneven_data_never_hangs(tmp_path: Path) -> None:
    completed, result = _run(tmp_path, "uneven", launcher=True)

    assert completed.returncode == 0, completed.stderr
    # A torchmetrics object the step updates does not count the repeated batch.
    assert result == {"padded_steps": 2, "custom_steps": 1, "metric_counted": 7.0}
    assert "the ranks hold different numbers of training batches; each runs 1" in completed.stderr


@pytest.mark.slow
def test_accumulating_batches_skip_gradient_synchronisation_between_steps(tmp_path: Path) -> None:
    completed, result = _run(tmp_path, "accumulate")

    assert completed.returncode == 0, completed.stderr
    assert result == {"global_step": 3, "no_sync": 2}


@pytest.mark.slow
def test_one_rank_asking_to_stop_stops_every_rank(tmp_path: Path) -> None:
    completed, result = _run(tmp_path, "stop")

    assert completed.returncode == 0, completed.stderr
    assert result == {"current_epoch": 2}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_a_failing_rank_stops_the_job_with_its_traceback(tmp_path: Path, strategy: str) -> None:
    completed, result = _run(tmp_path, "fail", strategy, launcher=True)

    assert completed.returncode == 0, completed.stderr
    assert result["failed_rank"] == 1
    assert "rank 1 gives up" in str(result["message"])


@pytest.mark.slow
def test_predictions_of_two_ranks_come_back_in_order(tmp_path: Path) -> None:
    completed, result = _run(tmp_path, "predict", "ddp_spawn", launcher=True)

    assert completed.returncode == 0, completed.stderr
    assert result == {"same": True}


@pytest.mark.slow
def test_evaluation_runs_as_many_forwards_on_every_rank_and_counts_each_sample_once(
    tmp_path: Path,
) -> None:
    completed, result = _run(tmp_path, "even")

    assert completed.returncode == 0, completed.stderr
    assert result == {"val_seen": 9, "same": True}
    counts = [json.loads((tmp_path / f"forwards-{rank}.json").read_text()) for rank in (0, 1)]
    # Validation, then prediction: 3 forwards in each run on both ranks, one of rank
    # 1's padding.
    assert counts == [[3, 3], [3, 3]]


@pytest.mark.slow
def test_a_resumed_ddp_run_continues_exactly(tmp_path: Path) -> None:
    completed, result = _run(tmp_path, "resume")

    assert completed.returncode == 0, completed.stderr
    whole, resumed = result["whole"], result["resumed"]
    assert isinstance(whole, list)
    assert len(whole) == 15
    assert resumed == whole


@pytest.mark.slow
def test_a_sharded_module_trained_in_spawned_copies_is_saved_as_shards_not_handed_back_whole(
    tmp_path: Path,
) -> None:
    # Spawned ranks train copies; FSDP shards them. Nothing gathers the module whole:
    # the caller's module stays as it was, the shards are saved, and that checkpoint
    # holds what one process trains from the same batches.
    one, spawned = tmp_path / "one", tmp_path / "spawned"
    one.mkdir()
    spawned.mkdir()
    completed, reference = _run(one, "spawned", "single_device", 1, launcher=True)
    assert completed.returncode == 0, completed.stderr
    completed, result = _run(spawned, "spawned", "fsdp", launcher=True)
    assert completed.returncode == 0, completed.stderr

    assert result["global_step"] == reference["global_step"] == 2 * 5
    assert result["unchanged"] is True
    assert result["path"] == str(spawned / "trained.ckpt")
    state, expected = result["state"], reference["state"]
    assert isinstance(state, dict)
    assert isinstance(expected, dict)
    assert state.keys() == expected.keys()
    for name, values in expected.items():
        assert state[name] == pytest.approx(values, abs=1e-6), name
    warnings = result["warnings"]
    assert isinstance(warnings, list)
    [warning] = warnings
    assert "the module passed to fit is unchanged" in warning
    assert "Hyper.load_from_checkpoint(path) reads it whole" in warning
