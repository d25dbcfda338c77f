"""Your own module from the command line and config files, on jsonargparse.

    plait fit --model my_pkg.MyModule --data my_pkg.MyData --trainer.strategy fsdp
    plait fit --config run.yaml --config more.yaml --trainer.max_epochs 3
    plait fit --config run.yaml --print_config > reproduce.yaml
    plait test --config run.yaml --ckpt_path plait_runs/checkpoints/last.ckpt

Every ``__init__`` argument of the module, the data module and the `Trainer` is an
option (``--model.width 64``, ``--trainer.max_epochs 5``), with its type and its
docstring in ``--help``. A strategy, logger or callback is given by name or by class
path with its own arguments (``--trainer.strategy plait.strategies.FSDPStrategy
--trainer.strategy.init_args.auto_wrap_policy ...``). From a ``main.py`` of yours::

    from plait.trainer.cli import cli

    cli(MyModule, MyData)  # python main.py fit --model.width 64 ...
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

import jsonargparse
from jsonargparse import ArgumentError, ArgumentParser, Namespace

from plait.core import ConfigurationError, seed_everything
from plait.core.errors import suggest
from plait.strategies import BaseStrategy
from plait.trainer.module import DataModule, Module
from plait.trainer.trainer import Trainer

if TYPE_CHECKING:
    from plait.trainer.metrics import Number

__all__ = ["COMMANDS", "build_config_parser", "run_config"]

COMMANDS: Final = ("fit", "validate", "test", "predict")

_DESCRIPTIONS: Final = {
    "fit": "Train the module (resuming from --ckpt_path), validating as it goes.",
    "validate": "Run the validation loop once (from --ckpt_path) and print its metrics.",
    "test": "Run the test loop once (from --ckpt_path) and print its metrics.",
    "predict": "Predict every batch of the data module's predict_dataloader.",
}


def _command_parser(
    command: str, model: type[Module] | None, data: type[DataModule] | None
) -> ArgumentParser:
    parser = ArgumentParser(
        description=_DESCRIPTIONS[command]
        + " The bundled examples run with --example instead (plait fit --example digits).",
        exit_on_error=False,
        allow_abbrev=False,  # a misspelt option is an error, never another option
    )
    parser.add_argument(
        "--config",
        action=jsonargparse.ActionConfigFile,  # type: ignore[attr-defined] # exported, unlisted
        help="a YAML config file (repeat to compose them)",
    )
    parser.add_argument(
        "--seed_everything",
        type=int,
        default=0,
        help="seeds every random generator on every rank (default: 0)",
    )
    # The strategy by its class, not the Strategy Protocol: a class path with its
    # init_args is then checked against plait's base class, as users write them.
    parser.add_class_arguments(
        Trainer, "trainer", fail_untyped=False, sub_configs=True, skip={"strategy"}
    )
    parser.add_argument(
        "--trainer.strategy",
        type=BaseStrategy | str,
        default="auto",
        help="a registered name (ddp, fsdp, deepspeed_stage_2, ...; plait list "
        "strategies), auto, or a strategy class with its init_args",
    )
    if model is None:
        parser.add_subclass_arguments(Module, "model", required=True)
    else:
        parser.add_class_arguments(model, "model", sub_configs=True)
    if data is None:
        parser.add_subclass_arguments(DataModule, "data", required=False)
    else:
        parser.add_class_arguments(data, "data", sub_configs=True)
    parser.add_argument(
        "--ckpt_path",
        type=str | None,
        default=None,
        help="a checkpoint to start from: a path, last or best",
    )
    return parser


def build_config_parser(
    model: type[Module] | None = None, data: type[DataModule] | None = None
) -> ArgumentParser:
    """The parser of ``plait fit|validate|test|predict`` for your own module and data.

    Args:
        model: The module class (``--model.*`` are its arguments); without it,
            ``--model`` names any `Module` subclass by class path.
        data: The data module class; without it, ``--data`` names any `DataModule`.
    """
    parser = ArgumentParser(
        prog="plait",
        description="Train, validate, test or predict with your own module, configured "
        "on the command line and in YAML files.",
        exit_on_error=False,
        allow_abbrev=False,  # the subcommands take it: a misspelt option is an error
    )
    commands = parser.add_subcommands(required=True, dest="command")
    for command in COMMANDS:
        commands.add_subcommand(command, _command_parser(command, model, data))
    return parser


_UNKNOWN: Final = re.compile(r"unrecognized arguments: (.+)", re.IGNORECASE)


_NOT_ACCEPTED: Final = re.compile(
    r"class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", re.IGNORECASE
)


def _explain(error: ArgumentError, parser: ArgumentParser, command: str | None) -> str:
    """The parse error, with the closest option for an option that does not exist."""
    message = str(error).strip()
    wrong_argument = _NOT_ACCEPTED.search(message)
    if wrong_argument is not None:
        return _explain_argument(*wrong_argument.groups()) or message
    found = _UNKNOWN.search(message)
    if found is None or command is None:
        return message
    known = _option_names(parser, command)
    for given in found.group(1).split():
        if not given.startswith("--"):
            continue
        name = given.split("=", 1)[0]
        close = suggest(name, known)
        if close is not None:
            return f"unknown option {name}; did you mean {close}?"
        return f"unknown option {name}; see plait {command} --help"
    return message


def _explain_argument(class_path: str, name: str) -> str | None:
    """A class's argument that does not exist, with the closest one it has."""
    module_name, _, attribute = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attribute)
        parameters = inspect.signature(cls).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    named = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    accepted = [p.name for p in parameters if p.kind not in named]
    close = suggest(name, accepted)
    hint = f"did you mean {close!r}?" if close else f"it takes {', '.join(accepted) or 'none'}"
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        hint += f"; keywords it passes on go in dict_kwargs (...dict_kwargs.{name} VALUE)"
    return f"{class_path} has no argument {name!r}; {hint}"


def _option_names(parser: ArgumentParser, command: str) -> list[str]:
    subcommands = parser._subcommands_action
    assert subcommands is not None  # the parser has its subcommands
    sub = subcommands._name_parser_map[command]
    # jsonargparse, as argparse, keeps a parser's options in _actions and lists no others.
    return [flag for action in sub._actions for flag in action.option_strings]


def run_config(
    argv: Sequence[str] | None = None,
    *,
    model: type[Module] | None = None,
    data: type[DataModule] | None = None,
) -> object:
    """Parse ``argv``, make the trainer, module and data module, and run the command.

    Returns:
        What the command returns: ``None`` for fit, the metrics of validate and
        test, the predictions of predict.

    Raises:
        ConfigurationError: The command line or a config file is wrong (an unknown
            option, a class that cannot be imported, a value of the wrong type).
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_config_parser(model, data)
    command = next((a for a in arguments if a in COMMANDS), None)
    try:
        config = parser.parse_args(arguments)
    except ArgumentError as error:
        raise ConfigurationError(
            _explain(error, parser, command),
            fix=f"see plait {command or 'fit'} --help",
        ) from None
    command = str(config.command)
    made = parser.instantiate(config)[command]
    return _run(command, config[command], made)


def _run(command: str, config: Namespace, made: Namespace) -> object:
    seed_everything(int(config.seed_everything))
    trainer = made.trainer
    module = made.model
    datamodule = made.get("data")
    if not isinstance(trainer, Trainer) or not isinstance(module, Module):
        raise ConfigurationError(
            "the config made no Trainer and Module",
            fix="give --model (a Module subclass) and the --trainer.* options",
        )
    ckpt_path = config.ckpt_path
    if command == "fit":
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        if trainer.is_global_zero:
            _report("fit", trainer.callback_metrics)
        return None
    if command == "predict":
        return trainer.predict(module, datamodule=datamodule, ckpt_path=ckpt_path)
    evaluate = trainer.validate if command == "validate" else trainer.test
    results = evaluate(module, datamodule=datamodule, ckpt_path=ckpt_path)
    if trainer.is_global_zero:
        _report(command, results[0])
    return results


def _report(command: str, metrics: Mapping[str, Number]) -> None:
    shown = "  ".join(f"{key}={value:.4f}" for key, value in sorted(metrics.items()))
    sys.stdout.write(f"{command}: {shown or 'nothing logged'}\n")
    sys.stdout.flush()
