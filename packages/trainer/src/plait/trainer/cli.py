"""The ``plait`` command: train your own module or a bundled example, or list what is registered.

plait fit --model my_pkg.MyModule --data my_pkg.MyData --trainer.strategy ddp
plait fit --config run.yaml --trainer.max_epochs 3
plait fit --example digits --strategy ddp --accelerator cpu --devices 2 --max-epochs 5
plait validate --example digits --ckpt-path plait_runs/checkpoints/last.ckpt
plait sbatch --example digits --strategy ddp --devices 4 --num-nodes 2 --time 04:00:00
plait list strategies

Your own module goes through `plait.trainer.config_cli` (jsonargparse: every
``__init__`` argument an option, YAML configs); `cli` runs it from your ``main.py``.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import logging
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

from plait.core import (
    AcceleratorRegistry,
    CheckpointError,
    CollectiveError,
    ConfigurationError,
    MissingDependencyError,
    PeerFailedError,
    PrecisionRegistry,
    Registry,
    Strategy,
    StrategyRegistry,
    seed_everything,
)
from plait.environments import batch_script
from plait.strategies.job import leave
from plait.trainer.examples import EXAMPLES
from plait.trainer.loggers import CSVLogger, Logger, TensorBoardLogger
from plait.trainer.trainer import Trainer

if TYPE_CHECKING:
    from plait.core.typing import DeviceSpec
    from plait.trainer.module import DataModule, Module

__all__ = ["build_parser", "cli", "main"]

_LOGGERS: Final = ("csv", "tensorboard", "none")
_LISTS: Final = ("strategies", "accelerators", "precisions", "examples")


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}; pass at least {minimum}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a finite number above 0, e.g. 0.01")
    return value


def _devices(text: str) -> DeviceSpec:
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    return text


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--example", required=True, choices=sorted(EXAMPLES),
        help="the bundled example to run: "
        + "; ".join(f"{e.name}: {e.description}" for e in EXAMPLES.values()),
    )  # fmt: skip
    parts = parser.add_argument_group("where it runs")
    parts.add_argument(
        "--strategy",
        default="auto",
        help="a registered strategy name, e.g. ddp, ddp_spawn, single_device (default: auto)",
    )
    parts.add_argument(
        "--accelerator", default="auto", help="cpu, cuda, mps, xla or auto (default: auto)"
    )
    parts.add_argument(
        "--devices",
        type=_devices,
        default="auto",
        help="how many devices (processes on the CPU), indices such as 0,2, -1 for all, or auto",
    )
    parts.add_argument(
        "--num-nodes",
        type=_at_least(1),
        default=1,
        help="machines in the job, started by torchrun or a scheduler (default: 1)",
    )
    parts.add_argument(
        "--tensor-parallel-size",
        type=_at_least(1),
        default=None,
        help="with --strategy model_parallel: ranks each layer is split over "
        "(default: the processes of a node); the rest read different data",
    )
    parts.add_argument(
        "--context-parallel-size",
        type=_at_least(1),
        default=None,
        help="with --strategy model_parallel: ranks each sequence is split over "
        "(default: 1; an example whose attention takes it, such as decoder)",
    )
    parts.add_argument(
        "--pipeline-parallel-size",
        type=_at_least(1),
        default=None,
        help="with --strategy model_parallel: ranks the model's stages are spread over "
        "(default: 1; an example that declares its stages, such as decoder)",
    )
    parts.add_argument(
        "--pipeline-schedule",
        default=None,
        help="with --pipeline-parallel-size: torch's schedule (default: 1F1B; GPipe, "
        "Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV)",
    )
    parts.add_argument(
        "--precision", default=None, help="32-true (default), bf16-mixed, 16-mixed, 64-true, ..."
    )
    output = parser.add_argument_group("output")
    output.add_argument(
        "--default-root-dir",
        default="plait_runs",
        help="where checkpoints and logs go (default: plait_runs)",
    )
    output.add_argument(
        "--logger", choices=_LOGGERS, default="csv", help="where metrics go (default: csv)"
    )
    output.add_argument(
        "--no-progress-bar", action="store_true", help="do not draw the progress bar"
    )
    output.add_argument(
        "--ckpt-path", default=None, help="a checkpoint to start from: a path, last or best"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds every random generator on every rank (default: 0)",
    )
    parser.add_argument(
        "--batch-size",
        type=_at_least(1),
        default=64,
        help="examples per batch on each rank (default: 64)",
    )


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    training = parser.add_argument_group("training")
    training.add_argument(
        "--max-epochs", type=_at_least(1), default=10, help="epochs to train (default: 10)"
    )
    training.add_argument(
        "--max-steps",
        type=_at_least(-1),
        default=-1,
        help="stop after this many optimizer steps (default: no limit)",
    )
    training.add_argument(
        "--lr", type=_positive, default=None, help="the learning rate (default: the example's)"
    )
    training.add_argument(
        "--accumulate-grad-batches",
        type=_at_least(1),
        default=1,
        help="batches per optimizer step (default: 1)",
    )
    training.add_argument(
        "--gradient-clip-val", type=_positive, default=None, help="clip gradients to this norm"
    )


def _add_slurm_options(parser: argparse.ArgumentParser) -> None:
    slurm = parser.add_argument_group("the SLURM job")
    slurm.add_argument(
        "--time", default=None, help="the time limit, e.g. 04:00:00 (default: the partition's)"
    )
    slurm.add_argument(
        "--signal-before",
        type=_at_least(0),
        default=120,
        help="seconds before the time limit to stop, save and requeue; 0 for never (default: 120)",
    )
    slurm.add_argument("--job-name", default=None, help="(default: plait-EXAMPLE)")
    slurm.add_argument("--partition", default=None, help="(default: the cluster's)")
    slurm.add_argument(
        "--sbatch-option",
        action="append",
        default=[],
        metavar="OPTION",
        help="one more #SBATCH line, e.g. --sbatch-option=--account=ml (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``plait`` command line."""
    parser = argparse.ArgumentParser(
        prog="plait",
        description="Train your own module, or plait's bundled examples, with any "
        "registered strategy, or list what is registered.",
        epilog="example: plait fit --example digits --strategy ddp --accelerator cpu "
        "--devices 2 --max-epochs 5; your own module: plait fit --model my_pkg.MyModule "
        "--data my_pkg.MyData --trainer.strategy ddp (plait fit --model ... --help lists "
        "every option; plait test and plait predict take the same)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fit = commands.add_parser(
        "fit", help="train an example, then report its validation metrics and checkpoint",
        description="Train an example with a strategy, show progress, and report the final "
        "validation metrics and where the checkpoint went.",
    )  # fmt: skip
    _add_run_options(fit)
    _add_training_options(fit)
    validate = commands.add_parser(
        "validate", help="evaluate an example (from a checkpoint) on its validation data",
        description="Run the validation loop of an example once and print its metrics.",
    )  # fmt: skip
    _add_run_options(validate)
    sbatch = commands.add_parser(
        "sbatch", help="print a SLURM batch script that runs `plait fit` and requeues itself",
        description="Print an sbatch script that trains an example as one SLURM task per "
        "device, stops and saves before the time limit, requeues itself and resumes "
        "(plait sbatch ... > job.sh; sbatch job.sh).",
    )  # fmt: skip
    _add_run_options(sbatch)
    _add_training_options(sbatch)
    _add_slurm_options(sbatch)
    listing = commands.add_parser(
        "list", help="list registered names", description="List registered names."
    )
    listing.add_argument("what", choices=_LISTS, help="what to list")
    return parser


def _logger(name: str, root: str) -> list[Logger]:
    if name == "none":
        return []
    if name == "tensorboard":
        return [TensorBoardLogger(root)]
    return [CSVLogger(root)]


def _say(line: str, *, error: bool = False) -> None:
    stream = sys.stderr if error else sys.stdout
    stream.write(line + "\n")
    stream.flush()


def _list(what: str) -> None:
    if what == "examples":
        for example in EXAMPLES.values():
            _say(f"{example.name:<36} {example.description}")
        return
    registries: dict[str, Registry[Any]] = {
        "strategies": StrategyRegistry,
        "accelerators": AcceleratorRegistry,
        "precisions": PrecisionRegistry,
    }
    for entry in registries[what].entries():
        _say(f"{entry.name:<36} {entry.description}")


def _fit_command(arguments: argparse.Namespace) -> list[str]:
    """``plait fit`` with the options of ``arguments`` that differ from fit's defaults."""
    program = Path(sys.executable).with_name("plait")
    command = [str(program)] if program.exists() else [sys.executable, "-m", "plait.trainer.cli"]
    command.append("fit")
    fit = argparse.ArgumentParser(add_help=False)
    _add_run_options(fit)
    _add_training_options(fit)
    # argparse keeps a parser's options in _actions, and has no public way to list them.
    for action in fit._actions:
        value = getattr(arguments, action.dest)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        command += [flag] if isinstance(value, bool) else [flag, str(value)]
    return command


def _sbatch(arguments: argparse.Namespace) -> str:
    devices = arguments.devices
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigurationError(
            f"--devices {devices!r} is not a number of devices per node, which a batch "
            "script needs for --ntasks-per-node",
            value=devices,
            fix="pass --devices N, e.g. --devices 4 for four GPUs (or processes) per node",
        )
    # Unknown names are refused here, not when the job starts hours later.
    if arguments.strategy.strip().lower() != "auto":
        StrategyRegistry.entry(arguments.strategy)
    if arguments.precision is not None:
        PrecisionRegistry.entry(arguments.precision)
    if arguments.ckpt_path not in (None, "last"):
        raise ConfigurationError(
            f"--ckpt-path {arguments.ckpt_path!r}: a requeued job resumes from its own "
            "last.ckpt, so the batch script passes --ckpt-path last",
            value=arguments.ckpt_path,
            fix="leave --ckpt-path out; to start from a checkpoint, copy it to "
            "DEFAULT_ROOT_DIR/checkpoints/last.ckpt first",
        )
    arguments.ckpt_path = "last"
    accelerator = AcceleratorRegistry.entry(arguments.accelerator)
    cuda = accelerator.factory is AcceleratorRegistry.entry("cuda").factory  # or an alias
    return batch_script(
        _fit_command(arguments),
        nodes=arguments.num_nodes,
        tasks_per_node=devices,
        gpus_per_node=devices if cuda else 0,
        time=arguments.time,
        signal_before=arguments.signal_before or None,
        job_name=arguments.job_name or f"plait-{arguments.example}",
        partition=arguments.partition,
        options=arguments.sbatch_option,
    )


def _strategy(arguments: argparse.Namespace) -> str | Strategy:
    """The strategy's name, or the strategy made with the sizes given.

    With ``--tensor-parallel-size``, ``--context-parallel-size``,
    ``--pipeline-parallel-size`` or ``--pipeline-schedule``, the strategy
    (``model_parallel``) is made with them.

    Raises:
        ConfigurationError: A size given for a strategy that has no such ranks, or
            a schedule without a pipeline.
    """
    names = (
        "tensor_parallel_size",
        "context_parallel_size",
        "pipeline_parallel_size",
        "pipeline_schedule",
    )
    sizes = {name: size for name in names if (size := getattr(arguments, name, None)) is not None}
    if "pipeline_schedule" in sizes and sizes.get("pipeline_parallel_size", 1) == 1:
        schedule = sizes["pipeline_schedule"]
        raise ConfigurationError(
            f"--pipeline-schedule {schedule} was given without a pipeline: "
            "--pipeline-parallel-size is 1",
            value=schedule,
            fix=f"pass --pipeline-parallel-size 2 (say) with --pipeline-schedule {schedule}, "
            "or drop --pipeline-schedule",
        )
    if not sizes:
        return str(arguments.strategy)
    entry = StrategyRegistry.entry(arguments.strategy)  # an unknown name: did you mean
    accepted = inspect.signature(entry.factory).parameters
    for name, size in sizes.items():
        if name not in accepted:
            flag = "--" + name.replace("_", "-")
            what = {
                "tensor_parallel_size": "layer over tensor-parallel",
                "context_parallel_size": "sequence over context-parallel",
            }.get(name, "model's stages over pipeline")
            raise ConfigurationError(
                f"{flag} {size} was given, and the strategy {arguments.strategy!r} splits "
                f"no {what} ranks",
                value=arguments.strategy,
                fix=f"pass --strategy model_parallel {flag} {size}, or drop {flag}",
            )
    return StrategyRegistry.get(arguments.strategy, **sizes)


def _run(arguments: argparse.Namespace) -> None:
    seed_everything(arguments.seed)
    example = EXAMPLES[arguments.example]
    module, data = example.build(lr=getattr(arguments, "lr", None), batch_size=arguments.batch_size)
    fitting = arguments.command == "fit"
    trainer = Trainer(
        accelerator=arguments.accelerator,
        strategy=_strategy(arguments),
        devices=arguments.devices,
        num_nodes=arguments.num_nodes,
        precision=arguments.precision,
        logger=_logger(arguments.logger, arguments.default_root_dir),
        max_epochs=arguments.max_epochs if fitting else 1,
        max_steps=arguments.max_steps if fitting else -1,
        accumulate_grad_batches=arguments.accumulate_grad_batches if fitting else 1,
        gradient_clip_val=arguments.gradient_clip_val if fitting else None,
        default_root_dir=arguments.default_root_dir,
        enable_progress_bar=not arguments.no_progress_bar,
    )
    if fitting:
        trainer.fit(module, datamodule=data, ckpt_path=arguments.ckpt_path)
        metrics = trainer.callback_metrics
    else:
        [metrics] = trainer.validate(module, datamodule=data, ckpt_path=arguments.ckpt_path)
    if not trainer.is_global_zero:
        return  # a rank the launcher started: rank 0 reports
    if fitting:
        _say(
            f"trained {example.name} with {arguments.strategy} on {trainer.num_processes} "
            f"process(es) ({trainer.strategy.root_device.type}) for {trainer.current_epoch} "
            f"epoch(s), {trainer.global_step} optimizer steps"
        )
    validation = {k: v for k, v in metrics.items() if k.startswith("val_")}
    _say("final validation: " + "  ".join(f"{k}={v:.4f}" for k, v in sorted(validation.items())))
    if example.metric in metrics:
        _say(f"{example.metric} = {metrics[example.metric]:.4f}")
    checkpoint = trainer.checkpoint_callback
    if fitting and checkpoint is not None and checkpoint.last_model_path:
        _say(f"checkpoint: {checkpoint.last_model_path}")
    if trainer.log_dir:
        _say(f"logs: {trainer.log_dir}")


_CONFIG_OPTIONS: Final = ("--model", "--data", "--config", "--trainer", "--print_config")


def _configured(arguments: Sequence[str]) -> bool:
    """Whether the command line is for your own module (not ``--example``)."""
    if any(a == "--example" or a.startswith("--example=") for a in arguments):
        return False
    command = next((a for a in arguments if not a.startswith("-")), None)
    if command in ("test", "predict"):
        return True
    return command in ("fit", "validate") and any(
        a.split("=", 1)[0].split(".", 1)[0] in _CONFIG_OPTIONS for a in arguments
    )


def cli(
    model: type[Module] | None = None,
    data: type[DataModule] | None = None,
    argv: Sequence[str] | None = None,
) -> int:
    """Run ``fit|validate|test|predict`` of your module from the command line; the exit status.

    For a ``main.py`` of your own (``raise SystemExit(cli(MyModule, MyData))``):
    ``--model.*`` and ``--data.*`` are the classes' ``__init__`` arguments. Without
    them, ``--model`` and ``--data`` take class paths. See `plait.trainer.config_cli`.
    """
    from plait.trainer.config_cli import run_config  # noqa: PLC0415 - jsonargparse, when asked

    arguments = list(sys.argv[1:] if argv is None else argv)
    return _guarded(lambda: run_config(arguments, model=model, data=data))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``plait`` command; returns the exit status."""
    given = list(sys.argv[1:] if argv is None else argv)
    if _configured(given):
        return cli(argv=given)
    arguments = build_parser().parse_args(given)
    if arguments.command == "list":
        _list(arguments.what)
        return 0
    if arguments.command == "sbatch":
        return _guarded(lambda: sys.stdout.write(_sbatch(arguments)))
    return _guarded(lambda: _run(arguments))


def _guarded(run: Callable[[], object]) -> int:
    """Run ``run``; the exit status, with plait's errors said in one line each."""
    try:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        run()
    except (ConfigurationError, MissingDependencyError, CheckpointError) as error:
        _say(f"plait: error: {error}", error=True)
        return 2
    except PeerFailedError as error:
        _say(f"plait: a rank failed: {error}", error=True)
        return 1
    except CollectiveError as error:
        _say(f"plait: error: {error}", error=True)
        return 1
    return 0


def command() -> NoReturn:
    """The ``plait`` command: `main`, then the end of its process (`plait.strategies.job.leave`).

    What the command's imports made (torch and plait) lives as long as the process:
    it is frozen first (``gc.freeze``), so that the cycle collector never scans it
    again, where each full collection over it costs every rank a fraction of a
    second of CPU. After success the process leaves without tearing the interpreter
    down, once its exit handlers have run: torch's communication threads can
    otherwise abort a rank whose job is done, and the launcher would report it failed.
    """
    gc.freeze()
    leave(main())


if __name__ == "__main__":
    command()
