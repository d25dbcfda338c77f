import os
import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from plait.core import ConfigurationError, seed_everything, worker_init_fn
from plait.core.seed import SEED_ENV_VAR, SEED_WORKERS_ENV_VAR


@pytest.fixture(autouse=True)
def clean_seed_variables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(SEED_ENV_VAR, raising=False)
    monkeypatch.delenv(SEED_WORKERS_ENV_VAR, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    state = (random.getstate(), torch.get_rng_state(), np.random.get_state())
    yield
    random.setstate(state[0])
    torch.set_rng_state(state[1])
    np.random.set_state(state[2])


def draw() -> tuple[float, float, float]:
    return random.random(), torch.rand(()).item(), float(np.random.rand())


def test_the_same_seed_gives_the_same_numbers_everywhere() -> None:
    assert seed_everything(1234) == 1234
    first = draw()
    seed_everything(1234)

    assert draw() == first
    seed_everything(1235)
    assert draw() != first


def test_the_seed_and_worker_choice_are_left_for_child_processes() -> None:
    seed_everything(42, workers=True)

    assert os.environ[SEED_ENV_VAR] == "42"
    assert os.environ[SEED_WORKERS_ENV_VAR] == "1"


def test_no_seed_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SEED_ENV_VAR, "7")

    assert seed_everything() == 7


def test_no_seed_and_no_environment_draws_and_records_one() -> None:
    seed = seed_everything()

    assert 0 <= seed < 2**32
    assert os.environ[SEED_ENV_VAR] == str(seed)


@pytest.mark.parametrize("seed", [-1, 2**32, True, 1.5, "12"])
def test_an_invalid_seed_is_rejected(seed: object) -> None:
    with pytest.raises(ConfigurationError, match="seed"):
        seed_everything(seed)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["twelve", "-3", "99999999999"])
def test_an_invalid_seed_in_the_environment_names_the_variable(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SEED_ENV_VAR, value)

    with pytest.raises(ConfigurationError, match=SEED_ENV_VAR):
        seed_everything()


class Noise(Dataset[float]):
    def __len__(self) -> int:
        return 4

    @override
    def __getitem__(self, index: int) -> float:
        return random.random() + float(np.random.rand())


def worker_draws(rank: int, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    monkeypatch.setenv("RANK", str(rank))
    seed_everything(3, workers=True)
    loader = DataLoader(
        Noise(),
        batch_size=1,
        num_workers=2,
        worker_init_fn=worker_init_fn,
        multiprocessing_context="fork",
    )
    return [float(batch) for batch in loader]


@pytest.mark.slow
def test_workers_are_seeded_apart_by_rank_and_index_and_reproducibly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rank0 = worker_draws(0, monkeypatch)
    rank1 = worker_draws(1, monkeypatch)

    assert len(set(rank0)) == 4  # the two workers of one rank differ
    assert set(rank0).isdisjoint(rank1)  # ranks differ
    assert worker_draws(0, monkeypatch) == rank0  # and all of it repeats
