"""A kind of example added in one file and a registration runs and fails as the built-in ones.

``conformance_kind.py`` is a third party's kind: its case, its property, what a rank
runs and its judge, registered in `EXAMPLE_KINDS`. The pool, the judge, the suite
and the reproduction snippet take it with no change of theirs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.conformance_kind import CENTRED, CentredCase

from plait.conformance import ContractViolation, RankPool, prove
from plait.conformance.suite import Suite

if TYPE_CHECKING:
    from plait.conformance.plugin import Lane

HERE = Path(__file__).resolve().parent
BROKEN = HERE / "conformance_broken.py"


@pytest.mark.slow
def test_a_kind_of_ones_own_is_proved_on_a_pool_grid_first() -> None:
    with RankPool("ddp", world_size=3, deadline=30) as pool:
        ran = prove(pool, CENTRED, max_examples=8, seed=0)
    assert ran == 1 + 8  # the grid's one example, then the drawn ones


@pytest.mark.slow
def test_it_catches_a_strategy_that_breaks_it_and_its_snippet_reproduces_the_failure() -> None:
    with (
        RankPool(f"{BROKEN}:MeanThatSums", world_size=2, deadline=10) as pool,
        pytest.raises(ContractViolation) as caught,
    ):
        prove(pool, CENTRED, max_examples=8, seed=0)
    violation = caught.value
    assert violation.property == "centred"
    assert violation.explicit, str(violation)  # the kind's grid holds it
    assert violation.case == CentredCase((1.0, 2.0))
    assert "rank 0: centred 1.0 to -2.0, not -0.5" in violation.headline
    assert "from tests.conformance_kind import CentredCase" in violation.snippet
    assert violation.describe()["kind"] == "CentredCase"

    # The snippet as printed, run from where the kind's module is found: it fails alike.
    rerun = subprocess.run(
        [sys.executable, "-c", violation.snippet],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        timeout=120,
        check=False,
    )
    assert rerun.returncode != 0
    assert "ContractViolation: centred failed for 'conformance_broken:MeanThatSums'" in (
        rerun.stderr
    ), rerun.stderr


class TestCentredOnDDP(Suite):
    """A suite of one property of one's own kind, on the plugin's lanes and pools."""

    strategies = ("ddp",)
    world_sizes = (2,)
    max_examples = 8

    def test_centred(self, plait_lane: Lane, request: pytest.FixtureRequest) -> None:
        self.prove_property("centred", request)
