import logging
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from plait.core import (
    ConfigurationError,
    get_global_rank,
    publish_rank,
    rank_zero_debug,
    rank_zero_info,
    rank_zero_only,
    rank_zero_warn,
)
from plait.core.rank import RANK_ENV_VARS


@pytest.fixture(autouse=True)
def no_rank_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in RANK_ENV_VARS:
        monkeypatch.delenv(variable, raising=False)


def test_without_any_variable_the_rank_is_zero() -> None:
    assert get_global_rank() == 0


@pytest.mark.parametrize("variable", RANK_ENV_VARS)
def test_each_launcher_variable_gives_the_rank(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, "3")

    assert get_global_rank() == 3


def test_rank_is_read_before_scheduler_variables() -> None:
    # torchrun inside a SLURM allocation: RANK is the truth, SLURM_PROCID is the task.
    assert get_global_rank({"RANK": "5", "SLURM_PROCID": "0"}) == 5


@pytest.mark.parametrize("value", ["one", "-1", "", "1.5"])
def test_a_malformed_rank_variable_is_a_configuration_error(value: str) -> None:
    with pytest.raises(ConfigurationError, match=f"RANK={value!r} is not a rank"):
        get_global_rank({"RANK": value})


@pytest.fixture
def single_process_group(tmp_path: Path) -> Iterator[None]:
    store = tmp_path / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("single_process_group")
def test_an_initialised_process_group_wins_over_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "7")

    assert get_global_rank() == 0


def test_rank_zero_only_runs_on_rank_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    @rank_zero_only
    def record(value: int) -> int:
        calls.append(value)
        return value * 2

    assert record(1) == 2
    monkeypatch.setenv("RANK", "1")
    assert record(2) is None
    assert calls == [1]


def test_rank_zero_only_returns_the_default_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    def answer() -> str:
        return "computed"

    wrapped = rank_zero_only(answer, default="skipped")
    monkeypatch.setenv("RANK", "2")

    assert wrapped() == "skipped"
    assert wrapped.__name__ == "answer"


def test_rank_zero_logging_happens_on_rank_zero_only(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG, logger="plait")
    rank_zero_info("info %d", 0)
    rank_zero_debug("debug %s", "zero")
    monkeypatch.setenv("RANK", "1")
    rank_zero_info("info %d", 1)
    rank_zero_debug("debug %s", "one")

    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "info 0"),
        (logging.DEBUG, "debug zero"),
    ]


def test_rank_zero_warn_points_at_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rank_zero_warn("careful", DeprecationWarning)
        monkeypatch.setenv("RANK", "1")
        rank_zero_warn("not shown")

    assert [str(w.message) for w in caught] == ["careful"]
    assert caught[0].category is DeprecationWarning
    assert caught[0].filename == __file__


class _RankZeroOnly:
    """A stand-in for lightning_utilities' ``rank_zero_only``: it keeps a ``rank``."""

    rank: int | None = None


def _lightning_utilities_switch(monkeypatch: pytest.MonkeyPatch) -> _RankZeroOnly:
    """The stand-in, loaded as lightning_utilities' module."""
    module = types.ModuleType("lightning_utilities.core.rank_zero")
    switch = _RankZeroOnly()
    module.rank_zero_only = switch  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return switch


def test_the_rank_is_given_to_lightning_utilities_where_a_project_loaded_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    switch = _lightning_utilities_switch(monkeypatch)
    monkeypatch.setenv("RANK", "3")

    publish_rank()
    assert switch.rank == 3
    publish_rank(1)
    assert switch.rank == 1


def test_publishing_the_rank_never_imports_lightning_utilities(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "lightning_utilities.core.rank_zero", raising=False)
    publish_rank(0)
    assert "lightning_utilities.core.rank_zero" not in sys.modules
