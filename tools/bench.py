"""Measure plait side by side with plain PyTorch (and Lightning where installed).

Each section runs both sides in the same invocation, interleaved round by round so
that the machine's noise hits both alike, and reports the median over rounds with
the minimum and maximum. Ratios (plait / baseline) are the result; absolute times
are this machine's.

Sections:
  imports      import cost over `import torch`, each in a fresh interpreter
  collectives  plait's collectives against raw torch.distributed, 2 gloo ranks
  conformance  the conformance suite's examples per second per property
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Final

import attrs

SECTIONS: Final = ("imports", "collectives", "conformance")
IMPORTED: Final = ("plait.core", "plait.strategies", "plait.trainer", "lightning.pytorch")


@attrs.frozen
class Row:
    """One measurement: plait's median against the baseline's, over rounds."""

    section: str
    name: str
    unit: str
    plait: list[float]
    baseline: list[float] | None
    baseline_name: str

    @property
    def ratio(self) -> float | None:
        """plait's median over the baseline's."""
        if not self.baseline:
            return None
        return statistics.median(self.plait) / statistics.median(self.baseline)

    def as_json(self) -> dict[str, object]:
        """The row with its medians, extremes and ratio."""
        return {
            "section": self.section,
            "name": self.name,
            "unit": self.unit,
            "baseline": self.baseline_name,
            "plait_median": statistics.median(self.plait),
            "plait_min": min(self.plait),
            "plait_max": max(self.plait),
            "baseline_median": statistics.median(self.baseline) if self.baseline else None,
            "baseline_min": min(self.baseline) if self.baseline else None,
            "baseline_max": max(self.baseline) if self.baseline else None,
            "ratio": self.ratio,
        }


# Imports.

_IMPORT_PROBE: Final = """
import importlib, sys, time
start = time.perf_counter()
import torch
middle = time.perf_counter()
importlib.import_module(sys.argv[1])
print(middle - start, time.perf_counter() - middle)
"""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def bench_imports(rounds: int) -> list[Row]:
    """Seconds to import each module after torch, against torch's own import."""
    modules = [module for module in IMPORTED if _installed(module)]
    torch_times: dict[str, list[float]] = {module: [] for module in modules}
    extra: dict[str, list[float]] = {module: [] for module in modules}
    for _ in range(rounds):
        for module in modules:  # interleaved: each round imports every module once
            out = subprocess.run(
                [sys.executable, "-c", _IMPORT_PROBE, module],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            torch_times[module].append(float(out[0]))
            extra[module].append(float(out[1]))
    return [
        Row(
            "imports",
            f"import {module} (after torch)",
            "s",
            extra[module],
            torch_times[module],
            "import torch",
        )
        for module in modules
    ]


# Collectives, in two gloo ranks.


def _timed(action: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        action()
    return (time.perf_counter() - start) / repeat


def _collective_cases(
    strategy: object, world_size: int
) -> list[tuple[str, int, Callable[[], object], Callable[[], object]]]:
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
            strategy.collectives.checked = False
            try:
                return action()
            finally:
                strategy.collectives.checked = True

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
        return lambda: strategy.reduce(tensor, op)

    def plait_broadcast(tensor: torch.Tensor) -> Callable[[], object]:
        return lambda: strategy.broadcast(tensor, src=0)

    cases = []
    for size, tensor, repeat in (("16 floats", small, 300), ("1M floats", large, 20)):
        cases += [
            (f"reduce sum, {size}, checked", repeat, raw_reduce(tensor, mean=False),
             plait_reduce(tensor, "sum")),
            (f"reduce sum, {size}, unchecked", repeat, raw_reduce(tensor, mean=False),
             unchecked(plait_reduce(tensor, "sum"))),
            (f"reduce mean, {size}, checked", repeat, raw_reduce(tensor, mean=True),
             plait_reduce(tensor, "mean")),
            (f"broadcast {size}", repeat, raw_broadcast(tensor),
             plait_broadcast(tensor)),
        ]  # fmt: skip
    return [
        *cases,
        ("broadcast a small dict", 300, raw_objects, lambda: strategy.broadcast(config, src=0)),
        ("barrier", 300, lambda: dist.barrier(group=group), strategy.barrier),
        ("all_gather 16 floats", 300, raw_gather, lambda: strategy.all_gather(small)),
    ]


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
    cases = _collective_cases(strategy, world_size)
    results: dict[str, dict[str, list[float]]] = {
        name: {"raw": [], "plait": []} for name, *_ in cases
    }
    for index in range(rounds + 1):  # the first round warms up and is dropped
        for name, repeat, raw, ours in cases:
            order = [("raw", raw), ("plait", ours)]
            if index % 2:  # alternate which side goes first
                order.reverse()
            for side, action in order:
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
    results = json.loads(out.read_text(encoding="utf-8"))
    return [
        Row("collectives", name, "s", sides["plait"], sides["raw"], "torch.distributed")
        for name, sides in results.items()
    ]


# Conformance.


def bench_conformance(examples: int, world_sizes: list[int]) -> list[Row]:
    """Hypothesis examples per second per property of the conformance suite, on ddp."""
    from plait.conformance import PROPERTIES, RankPool, prove  # noqa: PLC0415

    rows = []
    for size in world_sizes:
        with RankPool("ddp", world_size=size) as pool:
            pool.start()
            for prop in PROPERTIES:
                if size < prop.min_world_size:
                    continue
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
    """One line per row: plait's median (min-max), the baseline's, and the ratio."""
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            print(f"\n== {section}")
            print(
                f"{'measurement':42} {'plait (median)':>16} {'baseline (median)':>18} {'ratio':>7}"
            )
        base = _format(statistics.median(row.baseline), row.unit) if row.baseline else "-"
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        print(f"{row.name:42} {_format(statistics.median(row.plait), row.unit):>16} "
              f"{base:>18} {ratio:>7}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections, print the table and write the JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="few rounds: checks the tool runs")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, from: {', '.join(SECTIONS)}")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None, help="rounds per measurement")
    parser.add_argument("--json", type=Path, default=Path("bench.json"), help="where to write")
    args = parser.parse_args(argv)
    sections = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}: choose from {', '.join(SECTIONS)}")
    rounds = args.rounds or (3 if args.quick else 11)
    if rounds < 1:
        parser.error(f"--rounds={rounds} must be 1 or more")

    rows: list[Row] = []
    scratch = args.json.resolve().parent
    scratch.mkdir(parents=True, exist_ok=True)
    if "imports" in sections:
        rows += bench_imports(rounds)
    if "collectives" in sections:
        rows += bench_collectives(rounds, scratch)
    if "conformance" in sections:
        rows += bench_conformance(20 if args.quick else 200, [2] if args.quick else [1, 2, 3, 4])
    print_table(rows)
    report = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "rounds": rounds,
        "rows": [row.as_json() for row in rows],
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
