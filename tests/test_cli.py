"""The ``plait`` command, run as a user runs it: the main job and its errors."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests import warm

from plait.strategies.export import read_whole
from plait.trainer.cli import build_parser, main
from plait.trainer.examples.digits import DigitsClassifier

PLAIT = Path(sys.executable).with_name("plait")
COMMAND_TIMEOUT = 240

# pytest's own bound (120 s) is for a test in one process. A test here is bounded by its
# commands' timeouts (it runs up to four, each of seconds), and pytest's bound is two
# commands', so that a command that runs long is stopped and reported with its output.
pytestmark = pytest.mark.timeout(2 * COMMAND_TIMEOUT)


def _plait(
    *arguments: str, cwd: Path | None = None, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``plait ARGUMENTS``, its script run warm (`tests.warm`): what these tests check is
    what the command does, not how an interpreter starts (the test below starts one);
    the ranks its launcher starts are started as the command always starts them."""
    return warm.run(PLAIT, arguments, environ=environ, cwd=cwd, timeout=COMMAND_TIMEOUT)


def test_the_help_names_the_commands_and_an_example() -> None:
    # The command as a user types it: a new interpreter, from the installed script.
    completed = subprocess.run(
        [str(PLAIT), "--help"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
        check=False,
    )  # fmt: skip

    assert completed.returncode == 0
    for word in ("fit", "validate", "list", "plait fit --example digits --strategy ddp"):
        assert word in completed.stdout


def test_fit_help_lists_every_option_with_its_default() -> None:
    completed = _plait("fit", "--help")

    assert completed.returncode == 0
    options = ["--example", "--strategy", "--accelerator", "--devices", "--max-epochs"]
    options += ["--precision", "--ckpt-path", "--default-root-dir", "(default: 10)"]
    for option in options:
        assert option in completed.stdout


_OWN_MODULE = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from plait.trainer import DataModule, Module


class Regressor(Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(DataModule):
    def __init__(self, size: int = 32) -> None:
        super().__init__()
        x = torch.randn(size, 3, generator=torch.Generator().manual_seed(0))
        self.data = TensorDataset(x, x.sum(dim=1, keepdim=True))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=4, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=4)
"""


@pytest.mark.slow
def test_fit_trains_your_own_module_named_on_the_command_line_on_fsdp(tmp_path: Path) -> None:
    package = tmp_path / "my_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(_OWN_MODULE)
    completed = _plait(
        "fit", "--model", "my_pkg.Regressor", "--model.width", "6", "--data", "my_pkg.Data",
        "--trainer.strategy", "fsdp", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
        "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path),
        cwd=tmp_path, environ={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip

    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.count("fit: val_loss=") == 1  # rank 0 reports
    assert (tmp_path / "checkpoints" / "last.ckpt").is_dir()  # FSDP's shards


def _made_again_in_this_process(checkpoint: Path) -> None:
    # A sharded directory (FSDP's, DeepSpeed's), read whole here, in a process that
    # never joined the job: the module made from its hyperparameters, its weights loaded.
    model = DigitsClassifier.load_from_checkpoint(checkpoint, map_location="cpu")
    assert model.hparams == {"hidden": 128, "lr": 0.01, "dropout": 0.1}
    assert not model.training
    state = read_whole(checkpoint, optimizers=False)["state_dict"]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, state[name].float())


def test_list_strategies_shows_the_registered_names() -> None:
    completed = _plait("list", "strategies")

    assert completed.returncode == 0
    names = [line.split()[0] for line in completed.stdout.splitlines()]
    assert {"ddp", "ddp_spawn", "single_device"} <= set(names)


@pytest.mark.slow
def test_fit_trains_digits_with_deepspeed_stage_2_and_validates_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    completed = _plait(
        "fit", "--example", "digits", "--strategy", "deepspeed_stage_2", "--accelerator",
        "cpu", "--devices", "2", "--max-epochs", "3", "--default-root-dir", str(tmp_path),
    )  # fmt: skip

    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "trained digits with deepspeed_stage_2 on 2 process(es) (cpu) for 3 epoch(s)" in out
    accuracy = re.search(r"^val_acc = (\d\.\d+)$", out, re.MULTILINE)
    assert accuracy is not None, out
    assert float(accuracy.group(1)) > 0.8
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    assert (checkpoint / "latest").is_file()  # the engine's directory of partitions
    _made_again_in_this_process(checkpoint)

    validated = _plait(
        "validate", "--example", "digits", "--strategy", "deepspeed_stage_2", "--accelerator",
        "cpu", "--devices", "2", "--no-progress-bar", "--ckpt-path", str(checkpoint),
        "--default-root-dir", str(tmp_path),
    )  # fmt: skip
    assert validated.returncode == 0, validated.stderr
    assert f"val_acc = {accuracy.group(1)}" in validated.stdout  # the same weights


@pytest.mark.slow
def test_deepspeed_evaluates_and_resumes_a_ddp_checkpoint_and_ddp_resumes_deepspeeds(
    tmp_path: Path,
) -> None:
    trained = _plait(
        "fit", "--example", "digits", "--strategy", "ddp", "--accelerator", "cpu",
        "--devices", "2", "--max-epochs", "2", "--default-root-dir", str(tmp_path),
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    accuracy = re.search(r"^val_acc = (\d\.\d+)$", trained.stdout, re.MULTILINE)
    assert accuracy is not None, trained.stdout
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"

    # The weights of one file, partitioned into the stage-3 engine from rank 0.
    validated = _plait(
        "validate", "--example", "digits", "--strategy", "deepspeed_stage_3", "--accelerator",
        "cpu", "--devices", "2", "--no-progress-bar", "--ckpt-path", str(checkpoint),
        "--default-root-dir", str(tmp_path),
    )  # fmt: skip
    assert validated.returncode == 0, validated.stderr
    assert f"val_acc = {accuracy.group(1)}" in validated.stdout

    # The whole state, the optimizer's too, partitioned into ZeRO's; and back out.
    resumed = _plait(
        "fit", "--example", "digits", "--strategy", "deepspeed_stage_2", "--accelerator", "cpu",
        "--devices", "2", "--max-epochs", "3", "--no-progress-bar", "--ckpt-path",
        str(checkpoint), "--default-root-dir", str(tmp_path / "resumed"),
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    partitions = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    assert read_whole(partitions)["global_step"] == 3 * 12
    back = _plait(
        "fit", "--example", "digits", "--strategy", "ddp", "--accelerator", "cpu",
        "--devices", "2", "--max-epochs", "4", "--no-progress-bar", "--ckpt-path",
        str(partitions), "--default-root-dir", str(tmp_path / "back"),
    )  # fmt: skip
    assert back.returncode == 0, back.stderr
    saved = torch.load(tmp_path / "back" / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 4 * 12


def _fit_sharded(tmp_path: Path, trained: str, *flags: str) -> tuple[str, Path]:
    """``plait fit`` of digits with ``flags``: its accuracy (as printed) and checkpoint.

    The run must say ``trained``, reach 0.8, and leave shards every rank wrote, which
    this process (that never joined the job) reads whole into a module made anew.
    """
    completed = _plait(
        "fit", "--example", "digits", "--accelerator", "cpu", "--no-progress-bar",
        "--default-root-dir", str(tmp_path), *flags,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert trained in out
    accuracy = re.search(r"^val_acc = (\d\.\d+)$", out, re.MULTILINE)
    assert accuracy is not None, out
    assert float(accuracy.group(1)) > 0.8
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    assert (checkpoint / ".metadata").is_file()  # every rank wrote its shards
    _made_again_in_this_process(checkpoint)
    return accuracy.group(1), checkpoint


def _validates_alike(tmp_path: Path, checkpoint: Path, accuracy: str, *flags: str) -> None:
    """``plait validate`` from ``checkpoint`` with ``flags`` prints ``accuracy`` again."""
    validated = _plait(
        "validate", "--example", "digits", "--accelerator", "cpu", "--no-progress-bar",
        "--ckpt-path", str(checkpoint), "--default-root-dir", str(tmp_path), *flags,
    )  # fmt: skip
    assert validated.returncode == 0, validated.stderr
    assert f"val_acc = {accuracy}" in validated.stdout  # the same weights


@pytest.mark.slow
def test_fit_trains_digits_with_fsdp_and_validates_from_its_sharded_checkpoint(
    tmp_path: Path,
) -> None:
    accuracy, checkpoint = _fit_sharded(
        tmp_path,
        "trained digits with fsdp on 2 process(es) (cpu) for 3 epoch(s)",
        *("--strategy", "fsdp", "--devices", "2", "--max-epochs", "3"),
    )
    _validates_alike(tmp_path, checkpoint, accuracy, "--strategy", "fsdp", "--devices", "2")
    # One process, whose checkpoint IO writes files, reads the shards whole: the same.
    _validates_alike(tmp_path, checkpoint, accuracy)


@pytest.mark.slow
def test_fit_splits_digits_over_tensor_parallel_ranks_and_validates_from_its_shards(
    tmp_path: Path,
) -> None:
    # (dp=1, tp=2): the example's configure_model splits its layers over mesh["tp"].
    # Both ranks read all 1437 training images in batches of 64: 23 steps an epoch.
    accuracy, checkpoint = _fit_sharded(
        tmp_path,
        "with model_parallel on 2 process(es) (cpu) for 2 epoch(s), 46 optimizer steps",
        *("--strategy", "model_parallel", "--tensor-parallel-size", "2", "--devices", "2"),
        *("--max-epochs", "2"),
    )
    # One process reads the tensor-parallel shards whole: the same weights.
    _validates_alike(tmp_path, checkpoint, accuracy)


@pytest.mark.slow
def test_fit_splits_the_decoder_over_context_and_tensor_parallel_ranks_and_validates_whole(
    tmp_path: Path,
) -> None:
    # (dp=1, cp=2, tp=2) on 4 processes: each rank holds half of every sequence (its
    # load-balanced chunks) and half of the heads; its attention gathers keys and
    # values over cp, FSDP shards over dp_shard x cp. Batches of 64 (the command's
    # default), every rank reading all of them (dp=1), 16 steps.
    completed = _plait(
        "fit", "--example", "decoder", "--accelerator", "cpu", "--no-progress-bar",
        "--strategy", "model_parallel", "--context-parallel-size", "2", "--devices", "4",
        "--max-steps", "16", "--default-root-dir", str(tmp_path),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "trained decoder with model_parallel on 4 process(es) (cpu) for 1 epoch(s)" in out
    assert "16 optimizer steps" in out
    accuracy = re.search(r"^val_acc = (\d\.\d+)$", out, re.MULTILINE)
    assert accuracy is not None, out
    # A token after the first period repeats the one 4 places before it: 13 of 16
    # targets can be known, and guessing gives 1 in 32.
    assert float(accuracy.group(1)) > 0.7
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    assert (checkpoint / ".metadata").is_file()  # every rank wrote its shards
    # One process reads the shards whole; its attention is plain, over whole
    # sequences: the same accuracy.
    validated = _plait(
        "validate", "--example", "decoder", "--accelerator", "cpu", "--no-progress-bar",
        "--ckpt-path", str(checkpoint), "--default-root-dir", str(tmp_path),
    )  # fmt: skip
    assert validated.returncode == 0, validated.stderr
    assert f"val_acc = {accuracy.group(1)}" in validated.stdout


@pytest.mark.slow
def test_fit_pipelines_the_decoder_over_pp_x_dp_and_validates_it_whole(tmp_path: Path) -> None:
    # (pp=2, dp=2) on 4 processes: the decoder cut into two stages (1F1B over 2
    # microbatches), each sharded by FSDP over dp; the loss reaches every rank and
    # the logger, and validation runs the forward-only schedule.
    completed = _plait(
        "fit", "--example", "decoder", "--accelerator", "cpu", "--no-progress-bar",
        "--strategy", "model_parallel", "--pipeline-parallel-size", "2",
        "--tensor-parallel-size", "1", "--devices", "4", "--max-steps", "16",
        "--default-root-dir", str(tmp_path),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "trained decoder with model_parallel on 4 process(es) (cpu) for 1 epoch(s)" in out
    loss = re.search(r"^final validation: val_loss=(\d\.\d+)$", out, re.MULTILINE)
    assert loss is not None, out
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    assert (checkpoint / ".metadata").is_file()
    # Each stage's rank saved its parts under the whole model's names: one process
    # reads them whole, with no pipeline, and finds the same loss, and the accuracy
    # of a model that learned the rule (13 of 16 targets can be known).
    validated = _plait(
        "validate", "--example", "decoder", "--accelerator", "cpu", "--no-progress-bar",
        "--ckpt-path", str(checkpoint), "--default-root-dir", str(tmp_path),
    )  # fmt: skip
    assert validated.returncode == 0, validated.stderr
    whole = re.search(r"val_acc=(\d\.\d+)  val_loss=(\d\.\d+)", validated.stdout)
    assert whole is not None, validated.stdout
    assert whole.group(2) == loss.group(1)
    assert float(whole.group(1)) > 0.7


@pytest.mark.slow
def test_a_pipeline_accumulates_and_clips_as_one_process_does(tmp_path: Path) -> None:
    # Interleaved1F1B (4 stages on 2 ranks, 4 microbatches), 2 batches a step, the
    # norm clipped over every stage: the same model as one process without a
    # pipeline, to the last digit the command prints.
    options = (
        "--example", "decoder", "--accelerator", "cpu", "--no-progress-bar",
        "--max-steps", "4", "--accumulate-grad-batches", "2", "--gradient-clip-val", "0.5",
    )  # fmt: skip
    pipelined = _plait(
        "fit", *options, "--strategy", "model_parallel", "--pipeline-parallel-size", "2",
        "--pipeline-schedule", "Interleaved1F1B", "--devices", "2",
        "--default-root-dir", str(tmp_path / "pipelined"),
    )  # fmt: skip
    whole = _plait("fit", *options, "--devices", "1", "--default-root-dir", str(tmp_path / "whole"))
    assert pipelined.returncode == 0, pipelined.stderr
    assert whole.returncode == 0, whole.stderr
    pattern = r"val_loss=(\d\.\d+)$"
    mine = re.search(pattern, pipelined.stdout, re.MULTILINE)
    theirs = re.search(pattern, whole.stdout, re.MULTILINE)
    assert mine is not None, pipelined.stdout
    assert theirs is not None, whole.stdout
    assert mine.group(1) == theirs.group(1)


def test_a_pipeline_schedule_without_a_pipeline_is_refused_with_the_fix() -> None:
    completed = _plait(
        "fit", "--example", "decoder", "--strategy", "model_parallel",
        "--pipeline-schedule", "GPipe", "--accelerator", "cpu",
    )  # fmt: skip

    assert completed.returncode != 0
    assert "--pipeline-schedule GPipe was given without a pipeline" in completed.stderr
    assert "--pipeline-parallel-size 2 (say) with --pipeline-schedule GPipe" in completed.stderr


def test_a_tensor_parallel_size_for_a_strategy_without_one_is_refused_with_the_fix() -> None:
    completed = _plait(
        "fit", "--example", "digits", "--strategy", "ddp", "--tensor-parallel-size", "2",
        "--accelerator", "cpu", "--devices", "2",
    )  # fmt: skip

    assert completed.returncode != 0
    assert "--tensor-parallel-size 2 was given, and the strategy 'ddp'" in completed.stderr
    assert "--strategy model_parallel --tensor-parallel-size 2" in completed.stderr


@pytest.mark.slow
def test_fit_trains_digits_with_ddp_on_two_processes_and_reports(tmp_path: Path) -> None:
    completed = _plait(
        "fit", "--example", "digits", "--strategy", "ddp", "--accelerator", "cpu",
        "--devices", "2", "--max-epochs", "5", "--default-root-dir", str(tmp_path),
    )  # fmt: skip

    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "trained digits with ddp on 2 process(es) (cpu) for 5 epoch(s)" in out
    accuracy = re.search(r"^val_acc = (\d\.\d+)$", out, re.MULTILINE)
    assert accuracy is not None, out
    assert float(accuracy.group(1)) > 0.9  # ten classes: chance is 0.1
    checkpoint = Path(re.search(r"^checkpoint: (.+)$", out, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert checkpoint == tmp_path / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["global_step"] == 5 * 12
    logs = Path(re.search(r"^logs: (.+)$", out, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert (logs / "metrics.csv").is_file()

    validated = _plait(
        "validate", "--example", "digits", "--accelerator", "cpu", "--no-progress-bar",
        "--ckpt-path", str(checkpoint), "--default-root-dir", str(tmp_path),
    )  # fmt: skip
    assert validated.returncode == 0, validated.stderr
    assert f"val_acc = {accuracy.group(1)}" in validated.stdout  # the same weights, one process


def test_a_misspelt_strategy_is_named_with_the_closest_and_exits_2() -> None:
    completed = _plait("fit", "--example", "digits", "--strategy", "ddpp", "--accelerator", "cpu")

    assert completed.returncode == 2
    assert "no strategy named 'ddpp'" in completed.stderr
    assert "did you mean 'ddp'?" in completed.stderr


def test_an_unknown_example_is_refused_by_the_parser() -> None:
    completed = _plait("fit", "--example", "mnist")

    assert completed.returncode == 2
    assert "invalid choice: 'mnist'" in completed.stderr


def test_sbatch_prints_a_script_whose_srun_runs_fit_with_the_same_options_and_resumes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(
        ["sbatch", "--example", "digits", "--strategy", "fsdp", "--accelerator", "cuda",
         "--devices", "4", "--num-nodes", "2", "--max-epochs", "100", "--lr", "0.05",
         "--no-progress-bar", "--time", "04:00:00", "--sbatch-option=--account=ml"]
    )  # fmt: skip

    script = capsys.readouterr().out
    assert status == 0
    directives = [line.split()[1] for line in script.splitlines() if line.startswith("#SBATCH")]
    for directive in ("--job-name=plait-digits", "--nodes=2", "--ntasks-per-node=4"):
        assert directive in directives
    for directive in ("--gres=gpu:4", "--time=04:00:00", "--signal=USR1@120", "--requeue"):
        assert directive in directives
    assert "--account=ml" in directives
    [srun] = [line for line in script.splitlines() if line.startswith("srun ")]
    command = shlex.split(srun)[1:]
    assert command[0] == str(PLAIT)
    fit = build_parser().parse_args(command[1:])
    assert (fit.command, fit.example, fit.strategy, fit.accelerator) == (
        "fit", "digits", "fsdp", "cuda"
    )  # fmt: skip
    assert (fit.devices, fit.num_nodes, fit.max_epochs, fit.lr) == (4, 2, 100, 0.05)
    assert fit.no_progress_bar
    assert fit.ckpt_path == "last"  # a requeued job resumes


@pytest.mark.parametrize(("accelerator", "gres"), [("cuda", True), ("gpu", True), ("cpu", False)])
def test_sbatch_asks_for_a_gpu_per_task_when_the_accelerator_is_cuda(
    capsys: pytest.CaptureFixture[str], accelerator: str, gres: bool
) -> None:
    status = main(["sbatch", "--example", "digits", "--devices", "2", "--accelerator", accelerator])

    assert status == 0
    assert ("#SBATCH --gres=gpu:2\n" in capsys.readouterr().out) is gres


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--devices", "auto"], "--devices 'auto' is not a number of devices per node"),
        (["--devices", "0,1"], "--devices '0,1' is not a number of devices per node"),
        (["--devices", "2", "--ckpt-path", "best"], "a requeued job resumes from its own"),
        (["--devices", "2", "--strategy", "ddpp"], "did you mean 'ddp'?"),
        (["--devices", "2", "--accelerator", "cdua"], "did you mean 'cuda'?"),
        (["--devices", "2", "--precision", "bf16-mix"], "no precision named 'bf16-mix'"),
        (["--devices", "2", "--time", "4h"], "'4h' is not a SLURM time limit"),
        (["--devices", "2", "--time", "1", "--signal-before", "300"], "not shorter than"),
    ],
)
def test_sbatch_refuses_what_the_job_could_not_run_and_exits_2(
    capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    status = main(["sbatch", "--example", "digits", *options])

    printed = capsys.readouterr()
    assert status == 2
    assert message in printed.err
    assert printed.out == ""  # no half script to redirect into a file
