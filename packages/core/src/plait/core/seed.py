"""Seeding every random number generator a training run uses, on every rank."""

from __future__ import annotations

import hashlib
import importlib
import os
import random
from typing import Final

from plait.core.errors import ConfigurationError
from plait.core.rank import get_global_rank, rank_zero_info

__all__ = ["SEED_ENV_VAR", "SEED_WORKERS_ENV_VAR", "seed_everything", "worker_init_fn"]

SEED_ENV_VAR: Final = "PLAIT_GLOBAL_SEED"
"""Holds the seed given to `seed_everything`, so that child processes use it too."""

SEED_WORKERS_ENV_VAR: Final = "PLAIT_SEED_WORKERS"
"""``"1"`` when data-loader workers must be seeded with `worker_init_fn`."""

_MAX_SEED: Final = 2**32 - 1


def _parse_seed(value: object, where: str) -> int:
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ConfigurationError(
                f"{where}: the seed must be an integer, got {value!r}",
                value=value,
                fix=f"set it to an integer in [0, {_MAX_SEED}]",
            ) from None
    return _check_seed(value, where)


def _check_seed(seed: object, where: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigurationError(
            f"{where}: the seed must be an integer, got {seed!r} of type {type(seed).__name__}",
            value=seed,
            fix=f"pass an integer in [0, {_MAX_SEED}]",
        )
    if not 0 <= seed <= _MAX_SEED:
        raise ConfigurationError(
            f"{where}: the seed {seed} is outside [0, {_MAX_SEED}]",
            value=seed,
            fix=f"pass an integer in [0, {_MAX_SEED}], e.g. {seed % (_MAX_SEED + 1)}",
        )
    return seed


def seed_everything(seed: int | None = None, *, workers: bool = False) -> int:
    """Seed Python's ``random``, torch (CPU and every device) and NumPy if installed.

    The seed is also written to ``PLAIT_GLOBAL_SEED``, so that processes started
    later (by a launcher) seed themselves identically.

    Args:
        seed: The seed, in ``[0, 2**32 - 1]``. ``None`` reads ``PLAIT_GLOBAL_SEED``,
            or draws a fresh seed and logs it when that is unset.
        workers: Also seed every data-loader worker differently, by rank and worker
            index (see `worker_init_fn`).

    Returns:
        The seed used.

    Raises:
        ConfigurationError: The seed (given, or read from the environment) is not an
            integer in range.
    """
    if seed is None:
        from_env = os.environ.get(SEED_ENV_VAR)
        if from_env is None:
            seed = random.SystemRandom().randint(0, _MAX_SEED)
            rank_zero_info("No seed given: drew seed %d", seed)
        else:
            seed = _parse_seed(from_env, f"the environment variable {SEED_ENV_VAR}")
    else:
        seed = _check_seed(seed, "seed_everything")
    os.environ[SEED_ENV_VAR] = str(seed)
    os.environ[SEED_WORKERS_ENV_VAR] = "1" if workers else "0"
    _seed_generators(seed)
    return seed


def worker_init_fn(worker_id: int) -> None:
    """Seed a data-loader worker from the global seed, its rank and its index.

    Pass it as ``DataLoader(..., worker_init_fn=worker_init_fn)``. Without it every
    rank's worker ``i`` draws the same augmentations, because ranks share one seed.
    """
    import torch  # noqa: PLC0415 (only data-loader workers need it, long after import)

    base = torch.initial_seed() - worker_id  # the loader's seed, shared by its workers
    rank = get_global_rank()
    digest = hashlib.blake2b(f"{base}:{rank}:{worker_id}".encode(), digest_size=8).digest()
    _seed_generators(int.from_bytes(digest, "little") & _MAX_SEED)


def _seed_generators(seed: int) -> None:
    import torch  # noqa: PLC0415 (plait.core does not import torch at import)

    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA, MPS and XLA device
    # NumPy is optional: seed it when it is installed, even if not imported yet, so
    # that a program importing it later still draws the same numbers.
    try:
        numpy = importlib.import_module("numpy")
    except ImportError:
        return
    numpy.random.seed(seed)
