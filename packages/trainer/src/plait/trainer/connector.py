"""The connector: accelerator, devices, precision, plugins and strategy, resolved in one step.

Every part is taken as a registered name or an instance; compatibility is judged
only from what each part declares (the Protocols it meets, the arguments its
constructor takes, the devices its accelerator reports), so a strategy of yours is
treated exactly as a built-in one. Anything that cannot work together raises
`ConfigurationError` here, before any process starts.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Final

import attrs
import torch

from plait.core import (
    Accelerator,
    AcceleratorRegistry,
    CheckpointIO,
    CheckpointIORegistry,
    ClusterEnvironment,
    ConfigurationError,
    MethodAccelerator,
    Precision,
    PrecisionRegistry,
    Strategy,
    StrategyRegistry,
    SupportsLauncher,
    SupportsReplace,
    as_accelerator,
    as_cluster_environment,
    rank_zero_warn,
)
from plait.environments import detect_environment
from plait.strategies.launchers.subprocess import end_a_finished_hydra_job
from plait.strategies.remake import accepts
from plait.trainer.checks import check_count
from plait.trainer.layer_sync import LayerSync

if TYPE_CHECKING:
    from plait.core.typing import DeviceSpec
    from plait.environments import Detection

__all__ = ["Connection", "Plugin", "connect"]

log = logging.getLogger("plait.trainer")

Plugin = Precision | CheckpointIO | ClusterEnvironment | LayerSync | str
"""What ``plugins=[...]`` holds: part instances, or names from the part registries."""

_PART_ARGUMENTS: Final = ("accelerator", "precision", "checkpoint_io", "cluster_environment")


@attrs.frozen
class Connection:
    """The resolved parts of a run.

    Attributes:
        strategy: The strategy, made with every part.
        devices: The device indices the job uses on each node.
        num_nodes: How many nodes the job spans.
        reasons: One line per choice: what was chosen and why.
        one_process_per_node: The strategy drives every device of a node from one
            process (``dp``'s DataParallel), instead of one process per device.
        layer_sync: The layer sync given as a plugin (`TorchSyncBatchNorm`...), which
            the Trainer applies to the module; ``None``.
    """

    strategy: Strategy
    devices: tuple[int, ...]
    num_nodes: int
    reasons: tuple[str, ...]
    one_process_per_node: bool = False
    layer_sync: LayerSync | None = None

    @property
    def num_processes(self) -> int:
        """Processes in the whole job."""
        per_node = 1 if self.one_process_per_node else len(self.devices)
        return per_node * self.num_nodes


def _kind_of(plugin: object) -> str | None:
    for kind, protocol in (
        ("precision", Precision),
        ("checkpoint_io", CheckpointIO),
        ("cluster_environment", ClusterEnvironment),
    ):
        if isinstance(plugin, protocol):
            return kind
    if as_cluster_environment(plugin) is not None:
        return "cluster_environment"
    return "layer_sync" if isinstance(plugin, LayerSync) else None


def _named_kind(name: str) -> str:
    kinds = [
        kind
        for kind, registry in (
            ("precision", PrecisionRegistry),
            ("checkpoint_io", CheckpointIORegistry),
        )
        if name in registry
    ]
    if len(kinds) == 1:
        return kinds[0]
    choices = [*PrecisionRegistry.available(), *CheckpointIORegistry.available()]
    raise ConfigurationError.invalid_choice(
        "plugin name" if not kinds else f"plugin name (it names a {' and a '.join(kinds)})",
        name,
        choices,
        fix="pass a precision or checkpoint IO by its registered name, or pass an instance",
    )


def _sort_plugins(plugins: Sequence[Plugin] | Plugin | None) -> dict[str, object]:
    if plugins is None:
        return {}
    listed: Sequence[object] = (
        [plugins] if isinstance(plugins, str) or not isinstance(plugins, Sequence) else plugins
    )
    found: dict[str, object] = {}
    for plugin in listed:
        kind = _named_kind(plugin) if isinstance(plugin, str) else _kind_of(plugin)
        if kind is None:
            raise ConfigurationError(
                f"the plugin {plugin!r} is a {type(plugin).__name__}, which is neither a "
                "Precision, a CheckpointIO, a ClusterEnvironment nor a LayerSync",
                value=plugin,
                fix="implement one of those protocols of plait.core, or pass the object "
                "where it belongs (strategy=..., accelerator=...)",
            )
        if kind in found:
            raise ConfigurationError(
                f"two {kind} plugins were given: {found[kind]!r} and {plugin!r}",
                value=plugin,
                fix=f"pass one {kind} plugin",
            )
        # An environment written as Lightning's are (methods) is read through plait's
        # properties from here on.
        found[kind] = as_cluster_environment(plugin) if kind == "cluster_environment" else plugin
    return found


def _precision_name(precision: object) -> object:
    if isinstance(precision, int) and not isinstance(precision, bool):
        return str(precision)
    return precision


def _accelerator(
    value: Accelerator | str, strategy: Strategy | None, reasons: list[str]
) -> Accelerator:
    given_by_strategy = (
        strategy is not None
        and isinstance(strategy, SupportsReplace)
        and strategy.arguments.get("accelerator") is not None
    )
    if strategy is not None and (given_by_strategy or not isinstance(strategy, SupportsReplace)):
        if value != "auto" and not _same_accelerator(value, strategy.accelerator):
            raise ConfigurationError(
                f"two accelerators were given: {value!r} to the Trainer and "
                f"{strategy.accelerator!r} to the strategy",
                value=value,
                fix="give the accelerator in one place: Trainer(accelerator=...) or the "
                "strategy's constructor",
            )
        reasons.append(f"accelerator {strategy.accelerator.name!r}: the strategy's own")
        return strategy.accelerator
    if isinstance(value, str):
        built = AcceleratorRegistry.get(value)
        why = "the best available here" if value.strip().lower() == "auto" else "by name"
    else:
        adapted = as_accelerator(value)
        if adapted is None:
            raise ConfigurationError(
                f"accelerator={value!r} is a {type(value).__name__}, not an Accelerator",
                value=value,
                choices=AcceleratorRegistry.available(),
                fix="pass a registered name or an object implementing plait.core.Accelerator",
            )
        built, why = adapted, "given as an instance"
    if not built.is_available():
        raise ConfigurationError(
            f"the accelerator {built.name!r} is not available on this machine",
            value=built.name,
            fix="use accelerator='auto' (the best available) or accelerator='cpu'",
        )
    reasons.append(f"accelerator {built.name!r}: {why}")
    return built


def _same_accelerator(value: Accelerator | str, accelerator: Accelerator) -> bool:
    if isinstance(value, str):
        return value.strip().lower() == accelerator.name
    if isinstance(accelerator, MethodAccelerator):  # one of Lightning's kind, adapted
        return value is accelerator.accelerator or value is accelerator
    return value is accelerator


def interactive() -> bool:
    """Whether this program is an interactive session (a REPL, IPython or Jupyter).

    It has no program file a launcher could run again, so its ranks must be forked
    (``ddp_notebook``).
    """
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ipython = sys.modules.get("IPython")  # a notebook's kernel has imported it
    get_ipython = getattr(ipython, "get_ipython", None)
    return callable(get_ipython) and get_ipython() is not None


def _strategy_name(strategy: str, processes: int, externally: bool) -> tuple[str, str]:
    key = strategy.strip().lower()
    if key != "auto":
        return key, "by name"
    if processes > 1 and not externally and interactive():
        return "ddp_notebook", f"'auto' with {processes} processes in an interactive session"
    if processes > 1 or externally:
        return "ddp", f"'auto' with {processes} processes"
    return "single_device", "'auto' with one process"


def _check_interactive(strategy: Strategy, processes: int) -> None:
    """Refuse, in a notebook, a strategy whose launcher runs the program again.

    Raises:
        ConfigurationError: Several processes, in an interactive session, with a
            launcher that needs a program file (``ddp``'s, ``ddp_spawn``'s).
    """
    if processes <= 1 or not isinstance(strategy, SupportsLauncher) or not interactive():
        return
    launcher = strategy.launcher
    if launcher.is_interactive_compatible:
        return
    raise ConfigurationError(
        f"{strategy!r} starts its ranks with {type(launcher).__name__}, which runs this "
        "program again (or re-imports its __main__), and an interactive session (a "
        "notebook, a REPL) has no program file to run",
        value=strategy,
        fix="use strategy='ddp_notebook' (ranks forked from this session), or run your "
        "code as a script",
    )


def _detection(given: object) -> Detection | None:
    """The environment found for this process, unless one was given (``None`` then)."""
    # A multirun's next Hydra job reads its own environment, not the previous job's.
    end_a_finished_hydra_job()
    return None if given is not None else detect_environment()


def connect(
    *,
    accelerator: Accelerator | str = "auto",
    strategy: Strategy | str = "auto",
    devices: DeviceSpec = "auto",
    num_nodes: int = 1,
    precision: Precision | str | int | None = None,
    plugins: Sequence[Plugin] | Plugin | None = None,
) -> Connection:
    """Resolve every part of a run into one strategy.

    Raises:
        ConfigurationError: A part is unknown (the closest name is suggested), given
            twice, unavailable here, or incompatible with another (e.g. more devices
            than exist, a precision the device cannot run, several devices for a
            one-process strategy).
    """
    check_count("num_nodes", num_nodes, minimum=1, example="num_nodes=1 on one machine")
    reasons: list[str] = []
    parts = _sort_plugins(plugins)
    layer_sync = parts.pop("layer_sync", None)  # the Trainer's, not the strategy's
    assert layer_sync is None or isinstance(layer_sync, LayerSync)
    if precision is not None:
        if "precision" in parts:
            raise ConfigurationError(
                f"two precisions were given: precision={precision!r} and the plugin "
                f"{parts['precision']!r}",
                value=precision,
                fix="pass the precision once, either as precision= or in plugins",
            )
        parts["precision"] = _precision_name(precision)
    instance: Strategy | None = None
    if not isinstance(strategy, str):
        if not isinstance(strategy, Strategy):
            raise ConfigurationError(
                f"strategy={strategy!r} is a {type(strategy).__name__}, not a Strategy",
                value=strategy,
                choices=StrategyRegistry.available(),
                fix="pass a registered name or an object implementing plait.core.Strategy",
            )
        instance = strategy
    built_accelerator = _accelerator(accelerator, instance, reasons)
    given = parts.get("cluster_environment")
    # An environment given as a plugin is the one: the scheduler's variables are not
    # read at all (a job's partial SLURM variables must not refuse it).
    detection = _detection(given)
    environment = given if detection is None else detection.environment
    assert isinstance(environment, ClusterEnvironment)  # sorted by protocol
    if devices == "auto" and environment.creates_processes_externally:
        # The launcher decided: as many devices as it started processes on this node.
        devices = max(1, environment.world_size // num_nodes)
        reasons.append(f"devices={devices}: the processes launched per node")
    devices = _one_gpu_in_a_notebook(built_accelerator, devices, environment, reasons)
    indices, parallel_devices = _devices(built_accelerator, devices, environment, reasons)
    environment.validate_settings(len(indices), num_nodes)
    if detection is None:
        reasons.append(f"cluster environment {environment!r}: given as a plugin")
    else:
        reasons.append(f"cluster environment: {detection.reason}")
    processes = len(indices) * num_nodes
    _srun_unused(detection, processes, reasons)
    one_process = False
    if instance is None:
        assert isinstance(strategy, str)
        name, why = _strategy_name(strategy, processes, environment.creates_processes_externally)
        entry = StrategyRegistry.entry(name)
        one_process, processes = _processes(entry.factory, processes, num_nodes)
        _no_float16_autocast_on_the_cpu(parts, parallel_devices, reasons, entry.factory)
        arguments = _arguments_for(
            entry.factory,
            entry.name,
            parts=parts,
            accelerator=built_accelerator,
            parallel_devices=parallel_devices,
            reasons=reasons,
        )
        built = StrategyRegistry.get(name, **arguments)
        reasons.append(f"strategy {entry.name!r}: {why} ({built!r})")
    else:
        one_process, processes = _processes(type(instance), processes, num_nodes)
        _no_float16_autocast_on_the_cpu(parts, parallel_devices, reasons, type(instance))
        built = _rebuilt(
            instance,
            parts=parts,
            accelerator=built_accelerator,
            parallel_devices=parallel_devices,
            devices=devices,
            reasons=reasons,
        )
    _check_interactive(built, processes)
    if processes > 1 and not isinstance(built, SupportsLauncher) and built.world_size == 1:
        raise ConfigurationError(
            f"{built!r} runs in one process, and {processes} processes were asked for "
            f"(devices={devices!r}, num_nodes={num_nodes})",
            value=devices,
            fix="choose a strategy that starts processes, e.g. strategy='ddp', or devices=1",
        )
    for line in reasons:
        log.info("plait: %s", line)
    return Connection(
        strategy=built,
        devices=indices,
        num_nodes=num_nodes,
        reasons=tuple(reasons),
        one_process_per_node=one_process,
        layer_sync=layer_sync,
    )


def _srun_unused(detection: Detection | None, processes: int, reasons: list[str]) -> None:
    """Warn, as Lightning does, where ``srun`` could have started this job and did not.

    Inside a SLURM allocation (``SLURM_JOB_ID`` is set: ``salloc``, or a batch
    script that runs the program without ``srun``), where no scheduler's variables
    were found (nor an environment given), for a job of several processes, which
    plait then starts on this node alone. Lightning warns wherever ``srun`` is on
    the PATH; a machine with SLURM's commands installed and no allocation is told
    nothing.
    """
    if detection is None or detection.variables or processes <= 1:
        return
    if "SLURM_JOB_ID" not in os.environ or shutil.which("srun") is None:
        return
    command = " ".join(["srun", os.path.basename(sys.executable), *sys.argv])
    rank_zero_warn(  # once: the ranks plait starts make their Trainer too
        "the srun command is available, and this job was not started by it: plait starts "
        f"its {processes} processes on this machine alone; to run it on SLURM, start it "
        f"with srun: {command[:80]}",
        stacklevel=3,
    )
    reasons.append("srun is available but did not start this job")


def _processes(strategy: object, processes: int, num_nodes: int) -> tuple[bool, int]:
    """Whether ``strategy`` drives a node's devices from one process; the job's processes.

    ``strategy`` is its class or factory; it says so with ``one_process_over_devices
    = True`` (DataParallel's). The processes are one per device asked for, or one
    per node.
    """
    one = getattr(strategy, "one_process_over_devices", False) is True
    return one, num_nodes if one else processes


def _one_gpu_in_a_notebook(
    accelerator: Accelerator,
    devices: DeviceSpec,
    environment: ClusterEnvironment,
    reasons: list[str],
) -> DeviceSpec:
    """``devices="auto"`` on several CUDA GPUs in a notebook or REPL is one GPU, as in Lightning.

    Processes forked from an interactive session that has touched CUDA cannot use it;
    asking for the devices by number (``devices=4``) starts ``ddp_notebook`` over them.
    """
    if (
        devices != "auto"
        or environment.creates_processes_externally
        or getattr(accelerator, "device_type", None) != "cuda"
        or not interactive()
    ):
        return devices
    count = accelerator.auto_device_count()
    if count <= 1:
        return devices
    reasons.append(
        f"devices=1: 'auto' in an interactive session uses 1 of the {count} GPUs, as "
        f"Lightning does (pass devices={count} for ddp_notebook over all of them)"
    )
    return 1


def _no_float16_autocast_on_the_cpu(
    parts: dict[str, object],
    parallel_devices: list[torch.device],
    reasons: list[str],
    strategy: object,
) -> None:
    """``"16-mixed"`` by name on the CPU is ``"bf16-mixed"``, with a warning, as in Lightning.

    The CPU's autocast to float16 is slow and loses range; bfloat16 needs no scaler.
    A plugin given as an instance is used as it is, and so is the name where the
    ``strategy`` (its class or factory) says it refuses a gradient scaler
    (``refuses_gradient_scaler``): that strategy refuses ``"16-mixed"`` everywhere,
    as Lightning's does, rather than training in another precision than asked.
    """
    name = parts.get("precision")
    if not isinstance(name, str) or not parallel_devices or parallel_devices[0].type != "cpu":
        return
    if getattr(strategy, "refuses_gradient_scaler", False) is True:
        return
    precision = PrecisionRegistry.get(name, device_type="cpu")
    if not (
        precision.needs_scaler
        and precision.compute_dtype == torch.float16
        and precision.param_dtype == torch.float32
    ):
        return
    warnings.warn(
        f"precision={name!r} on the CPU: float16 autocast is not what CPUs compute "
        "well, so 'bf16-mixed' is used instead (as Lightning does); pass "
        "MixedPrecision('16-mixed', device_type='cpu') to insist on float16",
        UserWarning,
        stacklevel=4,
    )
    parts["precision"] = "bf16-mixed"
    reasons.append(f"precision 'bf16-mixed': {name!r} asked for on the CPU")


def _devices(
    accelerator: Accelerator,
    devices: DeviceSpec,
    environment: ClusterEnvironment,
    reasons: list[str],
) -> tuple[tuple[int, ...], list[torch.device]]:
    """The device indices of a node, and the device of each of its processes."""
    bound = (
        environment.creates_processes_externally
        and getattr(accelerator, "device_type", None) == "cuda"
        and isinstance(devices, int)
        and not isinstance(devices, bool)
        and devices > 1
        and accelerator.auto_device_count() == 1
    )
    if not bound:
        indices = accelerator.parse_devices(devices)
        return indices, accelerator.get_parallel_devices(indices)
    # srun --gpus-per-task=1, --gpu-bind=single:1, or CUDA_VISIBLE_DEVICES set per
    # process: a launcher started several processes on the node, each seeing its own
    # GPU as cuda:0. Start-up compares the GPUs' UUIDs, so that two ranks bound to
    # one GPU are refused.
    assert isinstance(devices, int)
    reasons.append(
        f"devices={devices}: the launcher bound one GPU to each process (it sees one), "
        "so every rank uses its cuda:0"
    )
    return tuple(range(devices)), accelerator.get_parallel_devices((0,)) * devices


def _arguments_for(
    factory: Callable[..., object],
    name: str,
    *,
    parts: Mapping[str, object],
    accelerator: Accelerator,
    parallel_devices: list[torch.device],
    reasons: list[str],
) -> dict[str, object]:
    arguments: dict[str, object] = {}
    if accepts(factory, "accelerator"):
        arguments["accelerator"] = accelerator
    for argument, value in parts.items():
        if not accepts(factory, argument):
            raise ConfigurationError(
                f"the strategy {name!r} does not take {argument}=, and one was given",
                value=value,
                fix=f"drop the {argument}, or choose a strategy that takes one",
            )
        arguments[argument] = value
    if accepts(factory, "parallel_devices"):
        arguments["parallel_devices"] = parallel_devices
    elif accepts(factory, "device"):
        if len(parallel_devices) > 1:
            raise ConfigurationError(
                f"the strategy {name!r} runs on one device, and {len(parallel_devices)} "
                "devices were asked for",
                value=len(parallel_devices),
                fix="choose a strategy that starts one process per device, e.g. "
                "strategy='ddp', or devices=1",
            )
        arguments["device"] = parallel_devices[0]
    reasons.extend(
        f"{argument} {parts[argument]!r}: given to the Trainer"
        for argument in _PART_ARGUMENTS
        if argument in parts and argument != "accelerator"
    )
    return arguments


def _rebuilt(
    strategy: Strategy,
    *,
    parts: Mapping[str, object],
    accelerator: Accelerator,
    parallel_devices: list[torch.device],
    devices: DeviceSpec,
    reasons: list[str],
) -> Strategy:
    if not isinstance(strategy, SupportsReplace):
        if parts:
            raise ConfigurationError(
                f"{type(strategy).__qualname__} cannot be made again with the "
                f"{', '.join(sorted(parts))} given to the Trainer: it does not implement "
                "plait.core.SupportsReplace",
                value=sorted(parts),
                fix="pass those parts to the strategy's own constructor",
            )
        reasons.append(f"strategy {strategy!r}: given as an instance, used as it is")
        return strategy
    changes: dict[str, object] = {}
    given = strategy.arguments
    for argument, value in parts.items():
        if given.get(argument) is not None:
            raise ConfigurationError(
                f"two {argument.replace('_', ' ')}s were given: {given[argument]!r} to the "
                f"strategy and {value!r} to the Trainer",
                value=value,
                fix=f"give the {argument.replace('_', ' ')} in one place",
            )
        changes[argument] = value
    if given.get("accelerator") is None and strategy.accelerator.name != accelerator.name:
        changes["accelerator"] = accelerator
    if strategy.accepts("parallel_devices"):
        own = given.get("parallel_devices")
        if own is None:
            changes["parallel_devices"] = parallel_devices
        elif devices != "auto" and (
            not isinstance(own, Sized) or len(own) != len(parallel_devices)
        ):
            raise ConfigurationError(
                f"two device lists were given: devices={devices!r} to the Trainer and "
                f"parallel_devices to the strategy",
                value=devices,
                fix="give the devices in one place",
            )
    elif len(parallel_devices) > 1 and not isinstance(strategy, SupportsLauncher):
        raise ConfigurationError(
            f"{strategy!r} runs on one device, and {len(parallel_devices)} devices were asked for",
            value=devices,
            fix="choose a strategy that starts one process per device, e.g. strategy='ddp'",
        )
    if not changes:
        reasons.append(f"strategy {strategy!r}: given as an instance, used as it is")
        return strategy
    rebuilt = strategy.replace(**changes)
    reasons.append(
        f"strategy {rebuilt!r}: the instance given, made again with "
        f"{', '.join(sorted(changes))} from the Trainer"
    )
    return rebuilt
