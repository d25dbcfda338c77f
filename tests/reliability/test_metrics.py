"""Metrics synced across ranks must name the same values on every rank, or fail at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.reliability.jobs import fit_command, run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
@pytest.mark.parametrize(
    ("names", "rank0", "rank1"),
    [
        ("0:metric_a,1:metric_b", "names=metric_a:mean", "names=metric_b:mean"),
        ("0:metric_a", "names=metric_a:mean", "names=(none)"),
    ],
    ids=["different names", "one rank only"],
)
def test_metrics_synced_under_different_names_fail_on_every_rank_within_60s(
    tmp_path: Path, strategy: str, names: str, rank0: str, rank1: str
) -> None:
    # The collective timeout is the default 5 minutes: the error comes at once.
    done = run(fit_command(strategy, 2, tmp_path, "max_epochs=1"), tmp_path, {"LOG_NAMES": names})

    assert done.returncode == 1
    assert done.since_fault() < 60  # from the first step, not after the timeout
    for rank in (0, 1):  # every rank raised it
        assert done.seen(rank)["error"] == "CollectiveMismatchError"
    assert f"ranks 0 called self.log(on_step, sync_dist=True)({rank0})" in done.stderr
    assert f"ranks 1 called self.log(on_step, sync_dist=True)({rank1})" in done.stderr
    losses = done.seen(0).get("losses", {})
    assert isinstance(losses, dict)
    assert "1" not in losses  # it stopped at the first step


def test_metrics_not_synced_may_differ_between_ranks(tmp_path: Path) -> None:
    done = run(
        fit_command("ddp", 2, tmp_path, "max_epochs=2"),
        tmp_path,
        {"LOCAL_NAMES": "0:seen_on_0,1:seen_on_1", "LOG_NAMES": "0:shared,1:shared"},
    )

    assert done.returncode == 0, done.stderr
    assert done.result() == {"global_step": 16, "epoch": 2}
