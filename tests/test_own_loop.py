"""One training loop of a team's own, the same on every strategy but for one line.

``own_loop_job.py`` is the loop: it accumulates two micro-batches per step with
``no_sync``, checkpoints the model, optimizer, scheduler and step with one
``save_checkpoint`` call, and resumes them in ranks launched afresh with one
``load_checkpoint`` call. On each strategy the resumed run goes on with the very
losses of the run that never stopped, loading leaves nothing over, and two
micro-batches train as one batch of twice the size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.reliability.jobs import processes_mentioning

JOB = Path(__file__).resolve().with_name("own_loop_job.py")
STEPS, SAVE_AT = 8, 4

pytestmark = pytest.mark.slow


def _run(root: Path, *strategies: str) -> dict[str, dict[str, dict[str, object]]]:
    root.mkdir(exist_ok=True)
    command = [sys.executable, str(JOB), str(root), *strategies]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert not processes_mentioning(str(root)), "a rank was left running"
    assert done.returncode == 0, done.stderr[-6000:]
    return {name: json.loads((root / f"{name}.json").read_text()) for name in strategies}


def _losses(run: dict[str, object]) -> dict[str, float]:
    losses = run["losses"]
    assert isinstance(losses, dict)
    return losses


@pytest.mark.parametrize(
    "strategies",
    [
        ("single_device", "ddp", "ddp_spawn", "fsdp"),
        ("deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3"),
    ],
    ids=["ddp-fsdp-single", "deepspeed"],
)
def test_the_same_loop_resumes_exactly_and_accumulates_on_every_strategy(
    tmp_path: Path, strategies: tuple[str, ...]
) -> None:
    if strategies[0].startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    results = _run(tmp_path, *strategies)

    for name, runs in results.items():
        full, resumed, big = (_losses(runs[mode]) for mode in ("full", "resumed", "big"))
        assert sorted(full, key=int) == [str(step) for step in range(1, STEPS + 1)], name
        # Restored in place, in one call: the next losses are the very same.
        assert resumed == {k: v for k, v in full.items() if int(k) > SAVE_AT}, name
        assert runs["resumed"]["left"] == [], name  # everything saved was taken back
        # The resumed run kept checkpointing.
        assert (tmp_path / f"{name}-resumed-step{STEPS}").exists(), name
        # Two micro-batches (the first inside no_sync) step as one twice the size.
        for step, loss in big.items():
            assert loss == pytest.approx(full[step], rel=1e-5, abs=1e-6), (name, step)
        assert full[str(STEPS)] < full["1"], name  # and it learns
