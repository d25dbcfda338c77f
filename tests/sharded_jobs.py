"""Running the sharding jobs (``fsdp_job.py``, ``deepspeed_job.py``) and reading what they wrote.

A job writes ``ROOT/TAG-rank<r>.json`` on every rank (losses by step, and what it
measured) and, on rank 0, ``ROOT/TAG-final.json``, the trained weights.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch
from tests import warm
from tests.processes import processes_mentioning

if TYPE_CHECKING:
    from pathlib import Path


JOB_TIMEOUT = 300
"""Seconds one job may take (its ranks started, trained and ended)."""


def run_job(
    job: Path, root: Path, tag: str, *options: str, env: dict[str, str] | None = None
) -> dict[str, object]:
    """Run ``job`` to its end (`JOB_TIMEOUT` seconds at most); rank 0's results.

    Fails the test with the job's stderr if it failed, or if a rank was left running
    (in its session, or naming its folder).
    """
    root.mkdir(parents=True, exist_ok=True)
    # Started warm (`tests.warm`): the job's ranks are forked from it, and what these
    # tests check is what they train and save, not how a job starts.
    done = warm.run(job, [str(root), tag, *options], environ=env, timeout=JOB_TIMEOUT)
    assert not processes_mentioning(str(root)), "a rank was left running"
    assert done.returncode == 0, done.stderr[-6000:]
    return rank_result(root, tag, 0)


def rank_result(root: Path, tag: str, rank: int) -> dict[str, object]:
    """What rank ``rank`` of the job ``tag`` wrote."""
    result: dict[str, object] = json.loads((root / f"{tag}-rank{rank}.json").read_text())
    return result


def losses_of(result: dict[str, object]) -> dict[str, float]:
    """The losses a rank recorded, by step (as a string)."""
    losses = result["losses"]
    assert isinstance(losses, dict)
    return losses


def assert_losses_close(a: dict[str, float], b: dict[str, float], tolerance: float) -> None:
    """The same steps, each loss within ``tolerance`` (relative, or absolute below 1)."""
    assert a.keys() == b.keys()
    for step, value in a.items():
        assert abs(value - b[step]) <= tolerance * max(1.0, abs(b[step])), (step, a, b)


def final_weights(root: Path, tag: str) -> dict[str, torch.Tensor]:
    """The trained weights rank 0 of the job ``tag`` wrote."""
    final = json.loads((root / f"{tag}-final.json").read_text())
    return {key: torch.tensor(value) for key, value in final.items()}
