"""Measure the conformance suite's throughput: Hypothesis examples per second per property.

Runs every property of the suite against a strategy on a persistent rank pool, for
each world size, and prints a table (and, with --json, writes one). The figures are
this machine's: compare them across runs on the same machine only.

    .venv/bin/python tools/conformance_throughput.py --strategy ddp --world-sizes 1,2,3,4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from plait.conformance import PROPERTIES, RankPool, prove


def _measure(strategy: str, world_size: int, examples: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    with RankPool(strategy, world_size=world_size) as pool:
        pool.start()
        for prop in PROPERTIES:
            if world_size < prop.min_world_size:
                continue
            start = time.perf_counter()
            count = prove(pool, prop, max_examples=examples)
            rates[prop.name] = count / (time.perf_counter() - start)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="ddp", help="registered name or module:factory")
    parser.add_argument("--world-sizes", default="1,2,3,4", help="comma-separated, e.g. 1,2")
    parser.add_argument("--examples", type=int, default=200, help="examples per property")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    sizes = [int(part) for part in args.world_sizes.split(",")]

    results = {size: _measure(args.strategy, size, args.examples) for size in sizes}

    names = [prop.name for prop in PROPERTIES]
    print(f"examples per second, strategy {args.strategy!r}, {args.examples} per property")
    print(f"{'property':26}" + "".join(f"{'ws=' + str(size):>10}" for size in sizes))
    for name in names:
        cells = [results[size].get(name) for size in sizes]
        row = "".join(f"{cell:10.0f}" if cell is not None else f"{'-':>10}" for cell in cells)
        print(f"{name:26}{row}")
    medians = [statistics.median(results[size].values()) for size in sizes]
    print(f"{'median':26}" + "".join(f"{value:10.0f}" for value in medians))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
