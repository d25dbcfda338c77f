"""Measure plait side by side with plain PyTorch (and Lightning where installed).

Each section runs both sides in the same invocation, interleaved round by round so
that the machine's noise hits both alike, and reports the median over rounds with
the minimum and maximum. Ratios (plait / baseline) are the result; absolute times
are this machine's.

Sections:
  imports      `import torch, <module>` against `import torch`, each in a fresh
               interpreter, garbage collection on (as a program imports them)
  cli          `plait fit --model ... --data ...` (jsonargparse) against `plait fit
               --example`, the same model: start to the end of a one-step run
  steps        seconds per training step on one process: a plain loop, plait's
               strategy in that loop, plait's Trainer (with and without logging), and
               the Trainer against the plain loop on batches made beforehand (no
               loader: the framework's own cost per step), and a step by hand
               (manual optimization) against the same plain loop
  ddp          two gloo processes: plain DDP (torch.multiprocessing, torchrun)
               against plait's ddp and ddp_spawn, per step and launch to first step
  collectives  plait's collectives (and Lightning's) against raw torch.distributed,
               in the same 2 gloo ranks
  fsdp         two gloo processes, one model of 4 blocks with AdamW on batches made
               beforehand: bytes of parameters + gradients + optimizer state each rank
               holds, peak resident growth, and seconds per step, for hand-written DDP
               and FSDP2 loops, FSDPStrategy in that loop, plait's Trainer with
               FSDPStrategy (Lightning's FSDP refuses the CPU: no side)
  deepspeed    the same model and batches: weights + optimizer state (with fp32 master
               copies) each rank holds, peak resident growth, and seconds per step,
               for hand-written DDP and DeepSpeed (ZeRO-2) loops, DeepSpeedStrategy in
               that loop, and plait's Trainer at ZeRO stages 0-3 (Lightning's
               DeepSpeed refuses the CPU: no side)
  model_parallel
               four gloo processes, a model of 4 MLP blocks that tensor parallelism
               splits: bytes each rank holds, peak resident growth and seconds per
               step for hand-written DDP, FSDP2 and a (dp=2, tp=2) mesh (tensor
               parallel, then FSDP2), ModelParallelStrategy in that loop, and plait's
               Trainer with it (the module's configure_model applies the plan)
  context_parallel
               two gloo processes, each half of every sequence: seconds per step of
               causal attention's forward and backward with plait's
               context_parallel_attention against the same exchange written by hand
               on torch's DTensor (tools/bench_context.py)
  pipeline     two gloo processes, a stack of MLP blocks in two pipeline stages: seconds
               per step (1F1B over 4 microbatches, then AdamW) with plait's Pipeline
               against torch's PipelineStage and schedule made by hand on the same
               group (tools/bench_pipeline.py)

               With --accelerator cuda, fsdp and deepspeed run on NCCL, one rank per
               GPU (at most 2), and add each rank's CUDA peak: the growth of
               torch.cuda.max_memory_allocated from just before the model was built
  scale        checked collectives as the ranks grow: seconds per call at 2 to 16 real
               gloo ranks (quick: 2 and 4), raw against plait unchecked, checked
               through the store and checked through the process group (auto takes
               the store up to STORE_CROSSOVER ranks); and one checked collective's
               work in the job's store at 2 to 1024 ranks (requests and bytes per rank
               and in all, and the time one client takes to send them to a TCPStore)
  checkpoints  a state of 1 GB sharded over two gloo ranks (64 MB with --quick): seconds
               to save it and to load it in place through plait's DistributedCheckpointIO
               against torch.distributed.checkpoint's own save and load; and, in one
               process, what an AsyncCheckpointIO save costs the training steps that run
               while it writes, against the time of a synchronous save: the default
               beside steps on every core, and one that keeps its buffers beside steps
               on one thread (a core left to the writer, as steps on a GPU leave it)
  conformance  the conformance suite's examples per second per property

Lightning's Trainer and collectives join the comparison where lightning is
importable; `tools/bench --with-lightning` installs it (requirements/lightning.txt)
into .cache/lightning for the run.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import multiprocessing
import os
import platform
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Final, Protocol, TypeAlias

import attrs

if TYPE_CHECKING:
    import torch

SECTIONS: Final = (
    "imports", "cli", "steps", "ddp", "fsdp", "deepspeed", "model_parallel",
    "context_parallel", "pipeline", "collectives", "scale", "checkpoints", "conformance",
)  # fmt: skip
IMPORTED: Final = ("plait.core", "plait.strategies", "plait.trainer", "lightning.pytorch")


@attrs.frozen
class Row:
    """One measurement: the measured side's median against the baseline's, over rounds."""

    section: str
    name: str
    unit: str
    measured: list[float]
    baseline: list[float] | None
    baseline_name: str

    @property
    def ratio(self) -> float | None:
        """The measured median over the baseline's."""
        if not self.baseline:
            return None
        return statistics.median(self.measured) / statistics.median(self.baseline)

    def as_json(self) -> dict[str, object]:
        """The row with its medians, extremes and ratio."""
        return {
            "section": self.section,
            "name": self.name,
            "unit": self.unit,
            "baseline": self.baseline_name,
            "median": statistics.median(self.measured),
            "min": min(self.measured),
            "max": max(self.measured),
            "baseline_median": statistics.median(self.baseline) if self.baseline else None,
            "baseline_min": min(self.baseline) if self.baseline else None,
            "baseline_max": max(self.baseline) if self.baseline else None,
            "ratio": self.ratio,
        }


# Imports.

_IMPORT_PROBE: Final = """
import gc, importlib, sys, time
full = []
gc.callbacks.append(lambda phase, info: full.append(phase) if info["generation"] == 2 else None)
start = time.perf_counter()
import torch
middle = time.perf_counter()
before = len(full)
importlib.import_module(sys.argv[1])
print(middle - start, time.perf_counter() - middle, (len(full) - before) // 2)
"""
"""As a user's program imports them: torch, then the module, garbage collection on. It
prints both times and how many full collections ran during the module's import."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def bench_imports(rounds: int) -> list[Row]:
    """``import torch, <module>`` against ``import torch``, in the same fresh interpreters.

    The garbage collector runs as in any program: a full collection (a scan of every
    object torch made, a tenth of a second or more) lands in whichever import
    allocates enough after torch's; the row says in how many rounds it landed in the
    module's.
    """
    modules = [module for module in IMPORTED if _installed(module)]
    torch_times: dict[str, list[float]] = {module: [] for module in modules}
    both: dict[str, list[float]] = {module: [] for module in modules}
    collected: dict[str, int] = dict.fromkeys(modules, 0)
    for _ in range(rounds):
        for module in modules:  # interleaved: each round imports every module once
            out = subprocess.run(
                [sys.executable, "-c", _IMPORT_PROBE, module],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            torch_times[module].append(float(out[0]))
            both[module].append(float(out[0]) + float(out[1]))
            collected[module] += int(out[2]) > 0
    return [
        Row(
            "imports",
            f"import torch, {module} (full collections in {collected[module]}/{rounds})",
            "s",
            both[module],
            torch_times[module],
            "import torch",
        )
        for module in modules
    ]


# The command line: your own module configured with jsonargparse, against --example.

_DIGITS: Final = "plait.trainer.examples.digits"


def bench_cli(rounds: int, scratch: Path) -> list[Row]:
    """Seconds from ``plait fit`` starting to the end of a run of one step, both ways.

    The same model and data (the digits example) named by class path and configured
    on jsonargparse, against ``--example digits`` on plain argparse: the difference
    is the configuration's own cost (importing jsonargparse, building the parser from
    every signature, making the classes).
    """
    plait = str(Path(sys.executable).with_name("plait"))
    with tempfile.TemporaryDirectory(dir=scratch) as root:
        return _bench_cli(rounds, plait, root)


def _bench_cli(rounds: int, plait: str, root: str) -> list[Row]:
    sides = {
        "example": [plait, "fit", "--example", "digits", "--accelerator", "cpu",
                    "--max-steps", "1", "--logger", "none", "--no-progress-bar",
                    "--default-root-dir", root],
        "config": [plait, "fit", "--model", f"{_DIGITS}.DigitsClassifier",
                   "--data", f"{_DIGITS}.DigitsData", "--trainer.accelerator", "cpu",
                   "--trainer.max_steps", "1", "--trainer.logger", "false",
                   "--trainer.enable_progress_bar", "false",
                   "--trainer.default_root_dir", root],
    }  # fmt: skip
    times: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, command in sides.items():  # interleaved: each round runs both
            start = time.perf_counter()
            _checked_run(command, f"plait fit ({side})")
            times[side].append(time.perf_counter() - start)
    return [
        Row(
            "cli",
            "plait fit --model ... --data ...: start to one step's end",
            "s",
            times["config"],
            times["example"],
            "plait fit --example",
        )
    ]


# Training, by the workloads of bench_training.py (each in fresh interpreters).

TRAINING: Final = Path(__file__).with_name("bench_training.py")


def _one_thread() -> dict[str, str]:
    # Every side runs one intra-op thread per process, as torchrun sets by default.
    return {**os.environ, "OMP_NUM_THREADS": "1"}


WARM_MODULES: Final = ("torch", "torch.distributed", "plait.strategies", "plait.trainer")
"""What the fork server of a smoke run imports once for every tool it runs (`run_python`)."""

_warm: list[multiprocessing.context.ForkServerContext] = []
"""The fork server's context, once `main` asks for it (--smoke)."""


def run_python(
    command: list[str], env: dict[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run ``command``, a tool's ``python SCRIPT ARGS``, capturing its output.

    In a smoke run (whose figures nobody reads) the script runs forked from a fork
    server that has imported torch and plait (`WARM_MODULES`), as ``python SCRIPT
    ARGS`` would run it: as ``__main__``, with its arguments, environment and intra-op
    threads, its exit status that of the script. Elsewhere, and for what is not a
    script (``-m``, ``-c``: a launch or an import, timed from the interpreter's start),
    a new interpreter runs it.
    """
    is_script = len(command) > 1 and command[0] == sys.executable and command[1].endswith(".py")
    if not (_warm and is_script):
        return subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    with tempfile.TemporaryDirectory(prefix="plait-bench-run-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        process = _warm[0].Process(target=_run_script, args=(command[1:], env, out, err))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
        code = process.exitcode if process.exitcode is not None else -9
        return subprocess.CompletedProcess(
            command, code, out.read_text(errors="replace"), err.read_text(errors="replace")
        )


def _run_script(argv: list[str], env: dict[str, str], out: Path, err: Path) -> None:
    # In the forked process: the script, as `python SCRIPT ARGS` runs it.
    import torch  # noqa: PLC0415 - the fork server's, imported already

    os.environ.clear()
    os.environ.update(env)
    with out.open("wb") as stdout, err.open("wb") as stderr:
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
    if "OMP_NUM_THREADS" in env:  # read by torch at its import, in the server
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.argv = list(argv)
    sys.path[0] = str(Path(argv[0]).resolve().parent)
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as leaving:
        if isinstance(leaving.code, int) or leaving.code is None:
            code = leaving.code or 0
        else:
            print(leaving.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - reported as python reports it
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _checked_run(command: list[str], what: str) -> str:
    done = run_python(command, _one_thread())
    if done.returncode != 0:
        raise RuntimeError(f"{what} exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


def bench_steps(rounds: int, steps: int, widths: list[int]) -> list[Row]:
    """Seconds per training step on one process, each side against the plain loop."""
    lightning = _installed("lightning.pytorch")
    sides = [
        "plain",
        "plait-strategy",
        "plait-trainer",
        "plait-trainer-log",
        "plain-memory",
        "plait-trainer-memory",
        "plait-trainer-manual-memory",
    ]
    if lightning:
        sides += ["lightning", "lightning-log"]
    rows = []
    for width in widths:
        command = [sys.executable, str(TRAINING), "steps", "--width", str(width), "--steps",
                   str(steps), "--rounds", str(rounds), "--sides", ",".join(sides)]  # fmt: skip
        times: dict[str, list[float]] = json.loads(
            _checked_run(command, "the steps workload").splitlines()[-1]
        )

        # (measured side, its label, baseline side, the baseline's label)
        pairs = [
            ("plait-strategy", "plait strategy in the plain loop", "plain", "plain loop"),
            ("plait-trainer", "plait Trainer", "plain", "plain loop"),
            ("plait-trainer-log", "plait Trainer logging a scalar", "plait-trainer",
             "plait Trainer"),
            ("plait-trainer-memory", "plait Trainer, batches in memory (its own cost)",
             "plain-memory", "plain loop, batches in memory"),
            ("plait-trainer-manual-memory", "plait Trainer, manual optimization, in memory",
             "plain-memory", "plain loop, batches in memory"),
        ]  # fmt: skip
        if lightning:
            pairs += [
                ("lightning", "Lightning Trainer", "plain", "plain loop"),
                ("lightning-log", "Lightning Trainer logging a scalar", "lightning",
                 "Lightning Trainer"),
                ("plait-trainer", "plait Trainer", "lightning", "Lightning Trainer"),
                ("plait-trainer-log", "plait Trainer logging a scalar", "lightning-log",
                 "Lightning logging"),
            ]  # fmt: skip
        rows += [
            Row("steps", f"width {width}: {label}", "s", times[side], times[base], base_label)
            for side, label, base, base_label in pairs
        ]
        rows += _step_profile(width, min(steps, 200))
    return rows


_PROFILED: Final = {
    # side profiled: its label
    "plait-trainer-memory": "plait Trainer",
    "plait-trainer-manual-memory": "plait Trainer, manual optimization",
}

PROFILES: Final[list[str]] = []
"""What one step of the plait Trainer calls, printed after the table (`print_table`)."""


def _step_profile(width: int, steps: int) -> list[Row]:
    """Python calls per step against the plain loop's, and plait's own functions a step calls.

    Counted (`bench_training.profile_steps`), not timed: the same on a busy machine.
    """
    sides = ["plain-memory", *_PROFILED]
    command = [sys.executable, str(TRAINING), "profile", "--width", str(width),
               "--steps", str(steps), "--sides", ",".join(sides)]  # fmt: skip
    profiles = json.loads(_checked_run(command, "the step profile").splitlines()[-1])
    plain = float(profiles["plain-memory"]["calls"])
    rows = []
    for side, label in _PROFILED.items():
        calls = float(profiles[side]["calls"])
        rows.append(Row("steps", f"width {width}: Python calls a step makes, {label}", "calls",
                        [calls], [plain], "plain loop"))  # fmt: skip
        listing = "\n".join(f"  {count:5.1f}  {name}" for name, count in profiles[side]["plait"])
        PROFILES.append(
            f"width {width}, {label}: {calls:.0f} Python calls a step, the plain loop "
            f"{plain:.0f}; plait's own functions, called per step:\n{listing}"
        )
    return rows


_DDP_SIDES: Final = {
    # name in the table: how the side is started
    "plain DDP, torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                            "2", str(TRAINING), "ddp", "--side", "plain-torchrun-rank"],
    "plain DDP, torch.multiprocessing": [str(TRAINING), "ddp", "--side", "plain-mp"],
    "plait ddp": [str(TRAINING), "ddp", "--side", "plait-ddp"],
    "plait ddp_spawn": [str(TRAINING), "ddp", "--side", "plait-ddp-spawn"],
    "Lightning ddp": [str(TRAINING), "ddp", "--side", "lightning-ddp"],
}  # fmt: skip


def bench_ddp(rounds: int, steps: int, width: int, scratch: Path) -> list[Row]:
    """Two gloo processes: seconds per step and from launch to the first step's end."""
    lightning = _installed("lightning.pytorch")
    sides = [side for side in _DDP_SIDES if lightning or "Lightning" not in side]
    step: dict[str, list[float]] = {side: [] for side in sides}
    launch: dict[str, list[float]] = {side: [] for side in sides}
    out = scratch / "ddp.json"
    for index in range(rounds):
        shift = index % len(sides)
        for side in [*sides[shift:], *sides[:shift]]:
            out.unlink(missing_ok=True)
            command = [sys.executable, *_DDP_SIDES[side], "--width", str(width),
                       "--steps", str(steps), "--out", str(out)]  # fmt: skip
            started = time.time()  # wall clock: rank 0 reports its first step's end in it
            _checked_run(command, side)
            result = json.loads(out.read_text(encoding="utf-8"))
            step[side].append(result["per_step"])
            launch[side].append(result["first_step_end"] - started)
    base = "plain DDP, torchrun"
    rows = []
    for kind, times, unit_name in (("step", step, "per step"), ("launch", launch, "launch")):
        rows += [
            Row("ddp", f"{unit_name}: {side}", "s", times[side], times[base], "torchrun")
            for side in sides
            if side != base
        ]
        if "Lightning ddp" in sides:
            rows.append(Row("ddp", f"{unit_name}: plait ddp", "s", times["plait ddp"],
                            times["Lightning ddp"], "Lightning ddp"))  # fmt: skip
        if kind == "launch":  # spawning against spawning
            spawned = times["plain DDP, torch.multiprocessing"]
            rows.append(Row("ddp", f"{unit_name}: plait ddp_spawn", "s", times["plait ddp_spawn"],
                            spawned, "torch.multiprocessing"))  # fmt: skip
    return rows


FSDP_TOOL: Final = Path(__file__).resolve().with_name("bench_fsdp.py")
_FSDP_SIDES: Final = {
    # name in the table: the side of tools/bench_fsdp.py
    "hand-written DDP": "plain-ddp",
    "hand-written FSDP2": "plain-fsdp2",
    "plait FSDPStrategy in that loop": "plait-strategy",
    "plait Trainer, fsdp": "plait-trainer",
}
"""Lightning's FSDP strategy refuses the CPU, so it has no side on this CPU benchmark."""


@attrs.frozen
class Placement:
    """Where the sharding sections run: the CPU (2 gloo ranks) or GPUs (NCCL)."""

    accelerator: str = "cpu"
    ranks: int = 2

    @classmethod
    def of(cls, accelerator: str) -> Placement:
        """2 gloo ranks on the CPU, or one NCCL rank per GPU (at most 2)."""
        if accelerator == "cpu":
            return cls()
        import torch  # noqa: PLC0415 - only the CUDA sections ask

        return cls(accelerator, min(2, torch.cuda.device_count()))

    @property
    def label(self) -> str:
        """What a row's section says of it."""
        return "" if self.accelerator == "cpu" else f" (cuda, {self.ranks} nccl)"


def _what_failed(stderr: str, limit: int = 4000) -> str:
    """A failed side's standard error, less the library's warnings, which can fill it."""
    lines = stderr.splitlines()
    kept = [
        line
        for previous, line in zip(["", *lines], lines, strict=False)
        if "Warning:" not in line and not ("Warning:" in previous and "return func" in line)
    ]
    return "\n".join(kept)[-limit:]


def _sharding_figures(
    sides: dict[str, str],
    kinds: tuple[str, ...],
    *,
    rounds: int,
    steps: int,
    width: int,
    scratch: Path,
    placement: Placement,
) -> dict[str, dict[str, list[float]]]:
    """Run each side of tools/bench_fsdp.py ``rounds`` times; each kind's figures by side."""
    figures: dict[str, dict[str, list[float]]] = {
        kind: {side: [] for side in sides} for kind in kinds
    }
    out = scratch / "sharding.json"
    # Large blocks are mapped and unmapped, not kept in the heap: the peak resident
    # size then follows the tensors alive, on every side alike.
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "DS_ACCELERATOR": placement.accelerator,
    }
    names = list(sides)
    for index in range(rounds):
        shift = index % len(names)
        for side in [*names[shift:], *names[:shift]]:
            out.unlink(missing_ok=True)
            command = [sys.executable, str(FSDP_TOOL), "--side", sides[side],
                       "--width", str(width), "--steps", str(steps), "--out", str(out),
                       "--accelerator", placement.accelerator,
                       "--ranks", str(placement.ranks)]  # fmt: skip
            done = run_python(command, env)
            if done.returncode != 0:
                raise RuntimeError(f"{side} failed:\n{_what_failed(done.stderr)}")
            result = json.loads(out.read_text(encoding="utf-8"))
            for kind, values in figures.items():
                values[side].append(float(result[kind]))
    return figures


def _cuda_peak_rows(
    section: str, figures: dict[str, dict[str, list[float]]], placement: Placement, ddp: str
) -> list[Row]:
    """Each side's CUDA peak growth against hand-written DDP's, on CUDA only."""
    if placement.accelerator != "cuda":
        return []
    return _memory_rows(section, figures, "CUDA peak growth per rank", "cuda_peak_growth", ddp)


def _memory_rows(
    section: str, figures: dict[str, dict[str, list[float]]], what: str, key: str, ddp: str
) -> list[Row]:
    """Each side's ``key`` bytes against hand-written DDP's."""
    by_side = figures[key]
    return [
        Row(section, f"{what}: {side}", "B", by_side[side], by_side[ddp], ddp)
        for side in by_side
        if side != ddp
    ]


def bench_fsdp(
    rounds: int, steps: int, width: int, scratch: Path, placement: Placement | None = None
) -> list[Row]:
    """Memory each rank holds and seconds per step, DDP against FSDP, on 2 gloo ranks."""
    placement = placement or Placement()
    section = "fsdp" + placement.label
    sides = list(_FSDP_SIDES)
    figures = _sharding_figures(
        _FSDP_SIDES, ("per_step", "held_bytes", "peak_growth", "cuda_peak_growth"),
        rounds=rounds, steps=steps, width=width, scratch=scratch, placement=placement,
    )  # fmt: skip
    ddp, fsdp2 = "hand-written DDP", "hand-written FSDP2"
    rows = _memory_rows(section, figures, "held per rank", "held_bytes", ddp)
    rows += _memory_rows(section, figures, "peak growth per rank", "peak_growth", ddp)
    rows += _cuda_peak_rows(section, figures, placement, ddp)
    rows += [
        Row(section, f"per step: {side}", "s", figures["per_step"][side],
            figures["per_step"][fsdp2], fsdp2)
        for side in sides if side != fsdp2
    ]  # fmt: skip
    return rows


_DEEPSPEED_SIDES: Final = {
    # name in the table: the side of tools/bench_fsdp.py
    "hand-written DDP": "plain-ddp",
    "hand-written DeepSpeed ZeRO-2": "plain-deepspeed",
    "hand-written DeepSpeed ZeRO-3": "plain-deepspeed-3",
    "plait DeepSpeedStrategy ZeRO-2 in that loop": "plait-deepspeed-strategy",
    **{f"plait Trainer, deepspeed stage {stage}": f"plait-deepspeed-{stage}" for stage in range(4)},
    "plait Trainer, deepspeed stage 2, deterministic": "plait-deepspeed-2-deterministic",
}
"""Lightning's DeepSpeed strategy refuses the CPU ("only supported on CUDA GPUs"): no side."""


def bench_deepspeed(
    rounds: int, steps: int, width: int, scratch: Path, placement: Placement | None = None
) -> list[Row]:
    """Weights and optimizer state each rank holds, and seconds per step, per ZeRO stage."""
    placement = placement or Placement()
    section = "deepspeed" + placement.label
    sides = list(_DEEPSPEED_SIDES)
    figures = _sharding_figures(
        _DEEPSPEED_SIDES, ("per_step", "weights_bytes", "peak_growth", "cuda_peak_growth"),
        rounds=rounds, steps=steps, width=width, scratch=scratch, placement=placement,
    )  # fmt: skip
    ddp, hand = "hand-written DDP", "hand-written DeepSpeed ZeRO-2"
    hand3, trainer3 = "hand-written DeepSpeed ZeRO-3", "plait Trainer, deepspeed stage 3"
    trainers = [side for side in sides if side.startswith("plait Trainer")]
    rows = _memory_rows(section, figures, "weights + optimizer per rank", "weights_bytes", ddp)
    rows += _memory_rows(section, figures, "peak growth per rank", "peak_growth", ddp)
    rows += _cuda_peak_rows(section, figures, placement, ddp)
    # The framework's own cost, beside the same engine driven by hand.
    rows += [
        Row(section, f"per step: {side}", "s", figures["per_step"][side],
            figures["per_step"][hand], hand)
        for side in ("plait DeepSpeedStrategy ZeRO-2 in that loop",
                     "plait Trainer, deepspeed stage 2")
    ]  # fmt: skip
    rows += [
        Row(section, f"{what}: {trainer3}", unit, figures[key][trainer3], figures[key][hand3],
            hand3)
        for what, key, unit in (("per step", "per_step", "s"), ("peak growth", "peak_growth", "B"))
    ]  # fmt: skip
    # What each stage costs against plain data parallelism.
    rows += [
        Row(section, f"per step against DDP: {side}", "s", figures["per_step"][side],
            figures["per_step"][ddp], ddp)
        for side in [hand, hand3, *trainers]
    ]  # fmt: skip
    # torch's deterministic mode fills every new tensor: what it costs a stage-2 run.
    plain, filled = (
        "plait Trainer, deepspeed stage 2",
        "plait Trainer, deepspeed stage 2, deterministic",
    )
    rows += [
        Row(section, f"{what}: deterministic=True against without", unit,
            figures[key][filled], figures[key][plain], plain)
        for what, key, unit in (("per step", "per_step", "s"), ("peak growth", "peak_growth", "B"))
    ]  # fmt: skip
    return rows


_MESH_SIDES: Final = {
    # name in the table: the side of tools/bench_fsdp.py
    "hand-written DDP": "mesh-ddp",
    "hand-written FSDP2": "mesh-fsdp2",
    "hand-written 2x2 (TP + FSDP2)": "mesh-2x2",
    "plait ModelParallelStrategy 2x2 in that loop": "plait-mesh-strategy",
    "plait Trainer, model_parallel 2x2": "plait-mesh-trainer",
}
"""Lightning's ModelParallelStrategy needs a CUDA device for its mesh: no side here."""


def bench_model_parallel(rounds: int, steps: int, width: int, scratch: Path) -> list[Row]:
    """State and peak memory per rank and seconds per step, DDP, FSDP and a 2x2 mesh.

    4 gloo ranks: the mesh splits each block's projections over 2 tensor-parallel
    ranks, then shards them over 2 data-parallel ranks.
    """
    section = "model_parallel"
    figures = _sharding_figures(
        _MESH_SIDES, ("per_step", "held_bytes", "peak_growth"),
        rounds=rounds, steps=steps, width=width, scratch=scratch,
        placement=Placement("cpu", 4),
    )  # fmt: skip
    ddp, hand = "hand-written DDP", "hand-written 2x2 (TP + FSDP2)"
    rows = _memory_rows(section, figures, "held per rank", "held_bytes", ddp)
    rows += _memory_rows(section, figures, "peak growth per rank", "peak_growth", ddp)
    # The framework's own cost, beside the same plan written by hand.
    rows += [
        Row(section, f"per step: {side}", "s", figures["per_step"][side],
            figures["per_step"][hand], hand)
        for side in ("plait ModelParallelStrategy 2x2 in that loop",
                     "plait Trainer, model_parallel 2x2")
    ]  # fmt: skip
    # What each way of splitting costs against plain data parallelism.
    rows += [
        Row(section, f"per step against DDP: {side}", "s", figures["per_step"][side],
            figures["per_step"][ddp], ddp)
        for side in ("hand-written FSDP2", hand)
    ]  # fmt: skip
    return rows


TOOLS: Final = Path(__file__).resolve().parent


def _plait_against_hand(
    tool: str, section: str, measured: str, hand: str, *, rounds: int, steps: int, scratch: Path
) -> list[Row]:
    # A two-rank tool that times plait's side and the same work by hand, in turns.
    out = scratch / f"{section}.json"
    _checked_run(
        [sys.executable, str(TOOLS / f"{tool}.py"), "--rounds", str(rounds),
         "--steps", str(steps), "--out", str(out)],
        tool,
    )  # fmt: skip
    figures: dict[str, list[float]] = json.loads(out.read_text(encoding="utf-8"))
    return [Row(section, measured, "s", figures["plait"], figures["hand"], hand)]


def bench_context_parallel(rounds: int, steps: int, scratch: Path) -> list[Row]:
    """Seconds per attention step over 2 context-parallel ranks, plait against by hand."""
    return _plait_against_hand(
        "bench_context", "context_parallel",
        "causal attention step, cp=2: context_parallel_attention",
        "the exchange by hand (DTensor)", rounds=rounds, steps=steps, scratch=scratch,
    )  # fmt: skip


def bench_pipeline(rounds: int, steps: int, scratch: Path) -> list[Row]:
    """Seconds per step of a two-stage pipeline, plait's against torch's built by hand."""
    return _plait_against_hand(
        "bench_pipeline", "pipeline", "training step, pp=2, 1F1B x 4 microbatches: Pipeline.step",
        "torch's stage and schedule by hand", rounds=rounds, steps=steps, scratch=scratch,
    )  # fmt: skip


# Collectives, in two gloo ranks.


def _timed(action: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        action()
    return (time.perf_counter() - start) / repeat


Case: TypeAlias = tuple[str, int, dict[str, Callable[[], object]]]
"""A collective's name, calls per timing, and how each side makes the call."""


class LightningCollectives(Protocol):
    """The collectives of Lightning's DDP strategy that the bench calls."""

    def reduce(
        self, tensor: torch.Tensor, group: object = None, reduce_op: str = "mean"
    ) -> torch.Tensor:
        """Reduce ``tensor`` (in place) over the ranks."""

    def broadcast(self, obj: object, src: int = 0) -> object:
        """``src``'s object on every rank."""

    def barrier(self, name: str | None = None) -> None:
        """Wait for every rank."""

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's tensor."""


def _lightning_collectives(world_size: int) -> LightningCollectives:
    """Lightning's DDP strategy over the process group already up (for its collectives)."""
    import torch  # noqa: PLC0415
    from lightning.pytorch.accelerators import CPUAccelerator  # noqa: PLC0415
    from lightning.pytorch.strategies import DDPStrategy  # noqa: PLC0415

    strategy: LightningCollectives = DDPStrategy(
        accelerator=CPUAccelerator(), parallel_devices=[torch.device("cpu")] * world_size
    )
    return strategy


def _collective_cases(
    strategy: object, world_size: int, lightning: LightningCollectives | None
) -> list[Case]:
    import torch  # noqa: PLC0415 - imported in the ranks only
    import torch.distributed as dist  # noqa: PLC0415

    from plait.strategies import DDPStrategy  # noqa: PLC0415

    assert isinstance(strategy, DDPStrategy)
    group = strategy.process_group
    small, large = torch.ones(16), torch.ones(1_000_000)
    config = {"lr": 0.1, "betas": (0.9, 0.999), "name": "adam"}

    def raw_reduce(tensor: torch.Tensor, *, mean: bool) -> Callable[[], object]:
        def run() -> object:
            out = tensor.clone()
            dist.all_reduce(out, group=group)
            return out.div_(world_size) if mean else out

        return run

    def unchecked(action: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            strategy.distributed_collectives.checked = False
            try:
                return action()
            finally:
                strategy.distributed_collectives.checked = True

        return run

    def raw_broadcast(tensor: torch.Tensor) -> Callable[[], object]:
        return lambda: dist.broadcast(tensor, src=0, group=group)

    def raw_objects() -> object:
        box: list[object] = [config]
        dist.broadcast_object_list(box, src=0, group=group)
        return box[0]

    def raw_gather() -> object:
        rows = [torch.empty_like(small) for _ in range(world_size)]
        dist.all_gather(rows, small, group=group)
        return torch.stack(rows)

    def plait_reduce(tensor: torch.Tensor, op: str) -> Callable[[], object]:
        return lambda: strategy.reduce(tensor, reduce_op=op)

    def plait_broadcast(tensor: torch.Tensor) -> Callable[[], object]:
        return lambda: strategy.broadcast(tensor, src=0)

    # Lightning's reduce works in place: it gets a copy, as the raw side makes one.
    def lightning_reduce(tensor: torch.Tensor, op: str) -> Callable[[], object]:
        return lambda: lightning is not None and lightning.reduce(tensor.clone(), reduce_op=op)

    def lightning_call(method: str, *args: object) -> Callable[[], object]:
        return lambda: getattr(lightning, method)(*args)

    # Back to back, raw all-reduces overlap one call's tail with the next call's
    # copy; a check (or any barrier) before each call cannot. This side shows how
    # much of a checked call's cost is that synchronisation.
    def synced(action: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            dist.barrier(group=group)
            return action()

        return run

    cases: list[Case] = []
    for size, tensor, repeat in (("16 floats", small, 300), ("1M floats", large, 20)):
        cases += [
            (f"reduce sum, {size}, checked", repeat,
             {"raw": raw_reduce(tensor, mean=False), "plait": plait_reduce(tensor, "sum"),
              "lightning": lightning_reduce(tensor, "sum"),
              "synced": synced(raw_reduce(tensor, mean=False))}),
            (f"reduce sum, {size}, unchecked", repeat,
             {"raw": raw_reduce(tensor, mean=False),
              "plait": unchecked(plait_reduce(tensor, "sum"))}),
            (f"reduce mean, {size}, checked", repeat,
             {"raw": raw_reduce(tensor, mean=True), "plait": plait_reduce(tensor, "mean"),
              "lightning": lightning_reduce(tensor, "mean")}),
            (f"broadcast {size}", repeat,
             {"raw": raw_broadcast(tensor), "plait": plait_broadcast(tensor),
              "lightning": lightning_call("broadcast", tensor, 0)}),
        ]  # fmt: skip
    cases += [
        ("broadcast a small dict", 300,
         {"raw": raw_objects, "plait": lambda: strategy.broadcast(config, src=0),
          "lightning": lightning_call("broadcast", config, 0)}),
        ("barrier", 300,
         {"raw": lambda: dist.barrier(group=group), "plait": strategy.barrier,
          "lightning": lightning_call("barrier")}),
        ("all_gather 16 floats", 300,
         {"raw": raw_gather, "plait": lambda: strategy.all_gather(small),
          "lightning": lightning_call("all_gather", small)}),
    ]  # fmt: skip
    if lightning is None:
        for _, _, sides in cases:
            sides.pop("lightning", None)
    return cases


def _collectives_rank(rank: int, world_size: int, port: int, rounds: int, out: str) -> None:
    os.environ.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0",
        "TORCHELASTIC_RUN_ID": "plait-bench", "PLAIT_CLUSTER_ENVIRONMENT": "torchelastic",
    })  # fmt: skip
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    from plait.strategies import DDPStrategy  # noqa: PLC0415

    torch.set_num_threads(1)  # two ranks on a machine of few cores: one thread each
    strategy = DDPStrategy(accelerator="cpu", timeout=timedelta(minutes=2))
    strategy.setup_environment()
    lightning = _lightning_collectives(world_size) if _installed("lightning.pytorch") else None
    cases = _collective_cases(strategy, world_size, lightning)
    results: dict[str, dict[str, list[float]]] = {
        name: {side: [] for side in sides} for name, _, sides in cases
    }
    for index in range(rounds + 1):  # the first round warms up and is dropped
        for name, repeat, sides in cases:
            order = list(sides.items())
            shift = index % len(order)  # each round, another side goes first
            for side, action in [*order[shift:], *order[:shift]]:
                dist.barrier(group=strategy.process_group)
                seconds = _timed(action, repeat)
                if index:
                    results[name][side].append(seconds)
    if rank == 0:
        Path(out).write_text(json.dumps(results), encoding="utf-8")
    strategy.teardown()


def bench_collectives(rounds: int, scratch: Path) -> list[Row]:
    """Seconds per call of each collective, plait against raw torch.distributed."""
    from plait.core.network import free_port  # noqa: PLC0415

    out = scratch / "collectives.json"
    context = multiprocessing.get_context("spawn")
    port = free_port()
    ranks = [
        context.Process(target=_collectives_rank, args=(rank, 2, port, rounds, str(out)))
        for rank in range(2)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    codes = [process.exitcode for process in ranks]
    if any(codes):
        raise RuntimeError(f"the collective ranks exited with {codes}")
    results: dict[str, dict[str, list[float]]] = json.loads(out.read_text(encoding="utf-8"))
    rows = []
    for name, sides in results.items():
        raw = sides["raw"]
        rows.append(Row("collectives", f"plait {name}", "s", sides["plait"], raw, "raw"))
        if "synced" in sides:
            rows.append(Row("collectives", f"plait {name}", "s", sides["plait"], sides["synced"],
                            "raw after a barrier"))  # fmt: skip
        if "lightning" in sides:
            lightning = sides["lightning"]
            rows += [
                Row("collectives", f"Lightning {name.removesuffix(', checked')}", "s",
                    lightning, raw, "raw"),
                Row("collectives", f"plait {name}", "s", sides["plait"], lightning, "Lightning"),
            ]  # fmt: skip
    return rows


# Scale.

SCALE_TOOL: Final = Path(__file__).resolve().with_name("bench_scale.py")


def _scale_tool(*args: str) -> None:
    _checked_run([sys.executable, str(SCALE_TOOL), *args], f"bench_scale {args[0]}")


def bench_scale(rounds: int, world_sizes: list[int], scratch: Path) -> list[Row]:
    """Checked collectives at several world sizes: time per call, and store work."""
    from plait.strategies.collectives import STORE_CROSSOVER  # noqa: PLC0415

    rows = []
    for size in world_sizes:
        out = scratch / f"scale-{size}.json"
        _scale_tool("ranks", "--world-size", str(size), "--rounds", str(rounds), "--out", str(out))
        seconds = json.loads(out.read_text(encoding="utf-8"))["seconds"]
        auto = "store" if size <= STORE_CROSSOVER else "backend"
        for case, sides in seconds.items():
            for side in ("unchecked", "store", "backend"):
                label = {"store": "via store", "backend": "via group"}.get(side, side)
                chosen = " (auto)" if side == auto else ""
                rows.append(Row("scale", f"{case}, {size} ranks, {label}{chosen}", "s",
                                sides[side], sides["raw"], "raw"))  # fmt: skip
    out = scratch / "scale-store.json"
    _scale_tool("store", "--world-sizes", "2,4,8,16,64,256,1024", "--out", str(out))
    for size, paths in json.loads(out.read_text(encoding="utf-8")).items():
        for path, work in paths.items():
            name = (
                f"store, {size} ranks, via {'store' if path == 'store' else 'group'}: "
                f"{work['total requests']:.0f} req, {work['total bytes read'] / 1e6:.3g} MB"
            )
            rows.append(Row("scale", name, "s", [work["seconds"]], None, ""))
    return rows


# Conformance.


CHECKPOINTS_TOOL: Final = Path(__file__).resolve().with_name("bench_checkpoints.py")


def bench_checkpoints(rounds: int, megabytes: int, scratch: Path) -> list[Row]:
    """Sharded save and load against raw DCP; an asynchronous save's cost to the steps."""
    figures = {}
    for workload in ("sharded", "async"):
        out = scratch / f"checkpoints-{workload}.json"
        with tempfile.TemporaryDirectory(prefix="plait-bench-", dir=scratch) as directory:
            _checked_run(
                [sys.executable, str(CHECKPOINTS_TOOL), workload, "--megabytes", str(megabytes),
                 "--rounds", str(rounds), "--dir", directory, "--out", str(out)],
                f"bench_checkpoints {workload}",
            )  # fmt: skip
        figures[workload] = json.loads(out.read_text(encoding="utf-8"))
    size = f"{megabytes} MB" if megabytes < 1024 else f"{megabytes / 1024:g} GB"
    sharded, asynchronous = figures["sharded"], figures["async"]
    raw = "torch.distributed.checkpoint"
    return [
        Row("checkpoints", f"save {size} sharded on 2 ranks", "s", sharded["save_plait"],
            sharded["save_raw"], raw),
        Row("checkpoints", f"load {size} sharded on 2 ranks, in place", "s",
            sharded["load_plait"], sharded["load_raw"], raw),
        Row("checkpoints", f"async save of {size}: its cost to steps on every core", "s",
            asynchronous["cost"], asynchronous["synchronous"], "a synchronous save"),
        Row("checkpoints", f"async save of {size}, kept buffers: cost to steps leaving a core",
            "s", asynchronous["cost_kept_one_thread"], asynchronous["synchronous"],
            "a synchronous save"),
    ]  # fmt: skip


def bench_conformance(examples: int, world_sizes: list[int]) -> list[Row]:
    """Hypothesis examples per second per property of the conformance suite, on ddp."""
    from plait.conformance import PROPERTIES, RankPool, prove  # noqa: PLC0415

    rows = []
    for size in world_sizes:
        with RankPool("ddp", world_size=size) as pool:
            pool.start()
            prove(pool, PROPERTIES[0], max_examples=5)  # untimed: first calls load lazily
            for prop in PROPERTIES:
                if size < prop.min_world_size or not prop.over_job:
                    continue  # point_to_point runs along a mesh's dimensions only
                start = time.perf_counter()
                count = prove(pool, prop, max_examples=examples)
                rate = count / (time.perf_counter() - start)
                rows.append(Row("conformance", f"{prop.name}, world size {size}",
                                "examples/s", [rate], None, ""))  # fmt: skip
    return rows


# Output.


def _format(seconds: float, unit: str) -> str:
    if unit != "s":
        return f"{seconds:,.0f} {unit}"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def print_table(rows: list[Row]) -> None:
    """One line per row: the measured median [min, max], the baseline's median, the ratio."""
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            print(f"\n== {section}")
            print(f"{'measurement':52} {'median [min, max]':>32}  {'baseline (median)':24} ratio")
        spread = (
            f"{_format(statistics.median(row.measured), row.unit)} "
            f"[{_format(min(row.measured), row.unit)}, {_format(max(row.measured), row.unit)}]"
        )
        base = "-"
        if row.baseline:
            base = f"{row.baseline_name} {_format(statistics.median(row.baseline), row.unit)}"
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        print(f"{row.name:52} {spread:>32}  {base:24} {ratio}")


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections, print the table and write the JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="few rounds: checks the tool runs")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="one round of each section at its smallest sizes (a few steps, 2 ranks, "
        "8 MB), each tool's script forked from a server that imported torch and plait, "
        "and the ranks of the fsdp, deepspeed, model_parallel, context_parallel, pipeline "
        "and checkpoints sections forked rather than spawned: runs every code path, "
        "measures nothing worth reading (tools/check)",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, from: {', '.join(SECTIONS)}")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None, help="rounds per measurement")
    parser.add_argument("--json", type=Path, default=Path("bench.json"), help="where to write")
    parser.add_argument(
        "--with-lightning",
        action="store_true",
        help="compare with Lightning too (tools/bench installs it for the run)",
    )
    parser.add_argument(
        "--accelerator",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the fsdp and deepspeed sections run (cuda: NCCL, a rank per GPU)",
    )
    args = parser.parse_args(argv)
    if args.with_lightning and not _installed("lightning.pytorch"):
        parser.error(
            "--with-lightning: lightning cannot be imported; run tools/bench, "
            "which installs it (requirements/lightning.txt) into .cache/lightning"
        )
    sections = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}: choose from {', '.join(SECTIONS)}")
    if args.smoke and args.rounds not in (None, 1):
        parser.error(f"--smoke runs one round; --rounds={args.rounds} asks for more")
    rounds = 1 if args.smoke else args.rounds or (3 if args.quick else 11)
    if rounds < 1:
        parser.error(f"--rounds={rounds} must be 1 or more")
    placement = Placement.of(args.accelerator)
    if placement.ranks < 1:
        parser.error("--accelerator cuda: this machine has no CUDA device; use --accelerator cpu")

    if args.smoke:
        # Nothing is read from a smoke run's figures: the tools fork their ranks from a
        # process that has imported torch, sparing each a second of CPU to import it
        # again (tools/two_ranks.py, start_method). The figures measured spawn.
        os.environ["PLAIT_BENCH_START_METHOD"] = "fork"
        # And the tools' scripts run forked from a server that imported torch and
        # plait once, each sparing two to three seconds of CPU (run_python).
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(WARM_MODULES))
        _warm.append(context)
    report_dir = args.json.resolve().parent
    report_dir.mkdir(parents=True, exist_ok=True)
    # The sections' own figures go to a folder of their own, removed at the end: only
    # the report stays beside where it was asked for.
    with tempfile.TemporaryDirectory(prefix=".bench-", dir=report_dir) as temporary:
        sizes = Sizes.SMOKE if args.smoke else Sizes.QUICK if args.quick else Sizes.FULL
        rows = _run_sections(sections, rounds, sizes=sizes, placement=placement,
                             scratch=Path(temporary))  # fmt: skip
    print_table(rows)
    for profile in PROFILES:
        print(f"\n{profile}")
    report = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "rounds": rounds,
        "rows": [row.as_json() for row in rows],
        "step_profiles": PROFILES,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.json}")
    return 0


@attrs.frozen
class Sizes:
    """How large each section's measurement is: steps, world sizes, megabytes, examples."""

    steps: int
    """Steps of the one-process and DDP sections."""
    sharded_steps: int
    """Steps of the FSDP, DeepSpeed and model-parallel sections."""
    context_steps: int
    pipeline_steps: int
    repeat: bool
    """Whether the multi-process sections run every round (or one round alone)."""
    world_sizes: tuple[int, ...]
    """The scale section's ranks."""
    megabytes: int
    """The checkpoint section's state."""
    examples: int
    conformance_world_sizes: tuple[int, ...]

    FULL: ClassVar[Sizes]
    QUICK: ClassVar[Sizes]
    SMOKE: ClassVar[Sizes]


Sizes.FULL = Sizes(
    steps=300, sharded_steps=100, context_steps=50, pipeline_steps=50, repeat=True,
    world_sizes=(2, 4, 8, 16), megabytes=1024, examples=200, conformance_world_sizes=(1, 2, 3, 4),
)  # fmt: skip
Sizes.QUICK = Sizes(
    steps=60, sharded_steps=20, context_steps=10, pipeline_steps=20, repeat=False,
    world_sizes=(2, 4), megabytes=64, examples=20, conformance_world_sizes=(2,),
)  # fmt: skip
Sizes.SMOKE = Sizes(
    steps=5, sharded_steps=3, context_steps=2, pipeline_steps=2, repeat=False,
    world_sizes=(2,), megabytes=8, examples=5, conformance_world_sizes=(2,),
)  # fmt: skip


def _run_sections(
    sections: list[str], rounds: int, *, sizes: Sizes, placement: Placement, scratch: Path
) -> list[Row]:
    # Each section asked for, in the table's order; their files go under ``scratch``.
    each = rounds if sizes.repeat else 1
    runs: dict[str, Callable[[], list[Row]]] = {
        "imports": lambda: bench_imports(rounds),
        "cli": lambda: bench_cli(rounds, scratch),
        "steps": lambda: bench_steps(rounds, sizes.steps, [32, 256]),
        "ddp": lambda: bench_ddp(each, sizes.steps, 256, scratch),
        "fsdp": lambda: bench_fsdp(each, sizes.sharded_steps, 512, scratch, placement),
        "deepspeed": lambda: bench_deepspeed(each, sizes.sharded_steps, 512, scratch, placement),
        "model_parallel": lambda: bench_model_parallel(each, sizes.sharded_steps, 512, scratch),
        "context_parallel": lambda: bench_context_parallel(rounds, sizes.context_steps, scratch),
        "pipeline": lambda: bench_pipeline(rounds, sizes.pipeline_steps, scratch),
        "collectives": lambda: bench_collectives(rounds, scratch),
        "scale": lambda: bench_scale(3 if sizes.repeat else 1, list(sizes.world_sizes), scratch),
        "checkpoints": lambda: bench_checkpoints(
            min(rounds, 3) if sizes.repeat else 1, sizes.megabytes, scratch
        ),
        "conformance": lambda: bench_conformance(
            sizes.examples, list(sizes.conformance_world_sizes)
        ),
    }
    rows: list[Row] = []
    for name in SECTIONS:  # in the table's order, whatever order they were asked in
        if name in sections:
            rows += runs[name]()
    return rows


if __name__ == "__main__":
    sys.exit(main())
