"""What a run carries across processes and checkpoints: RNG states, batches on devices."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping
from typing import TypeVar

import torch

from plait.core import is_module_available
from plait.precision import LEAF_TYPES, map_tensors

__all__ = ["preserved_rng", "rng_state", "set_rng_state", "to_device"]

T = TypeVar("T")


def to_device(data: T, device: torch.device) -> T:
    """``data`` with every tensor (in tuples, lists and dicts, at any depth) on ``device``.

    What is on ``device`` already is returned as it is, containers included.
    """
    if _on(data, device):  # the usual batch: a walk without a call per tensor
        return data

    def move(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == device:  # the usual case on CPU: a comparison beats a no-op `to`
            return tensor
        return tensor.to(device, non_blocking=True)

    return map_tensors(data, move)


def _on(data: object, device: torch.device) -> bool:
    """Whether ``data`` (tuples and lists of plain tensors and leaves) is all on ``device``.

    ``False`` where it cannot tell at once (any other container, a tensor subclass):
    `map_tensors` then walks it, and still returns what is on ``device`` as it is.
    """
    kind = type(data)
    if kind is torch.Tensor:
        return data.device == device  # type: ignore[attr-defined,no-any-return]
    if kind is not tuple and kind is not list:
        return kind in LEAF_TYPES
    for item in data:  # type: ignore[attr-defined]
        kind = type(item)
        if kind is torch.Tensor:
            if item.device != device:
                return False
        elif kind not in LEAF_TYPES and not _on(item, device):
            return False
    return True


def rng_state(*, cuda: bool = True) -> dict[str, object]:
    """This process's random states: Python's, torch's (CPU and CUDA) and NumPy's.

    Made only of tensors, numbers, strings and tuples, so that checkpoints holding
    it load with ``weights_only=True``. ``cuda=False`` leaves CUDA's out, and CUDA
    uninitialised (a process that forks ranks later must not initialise it).
    """
    version, internal, gauss = random.getstate()
    state: dict[str, object] = {
        "python": (version, tuple(internal), gauss),
        "torch": torch.get_rng_state(),
    }
    if cuda and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if is_module_available("numpy"):
        import numpy  # noqa: PLC0415 (optional)

        legacy = numpy.random.get_state(legacy=True)
        assert isinstance(legacy, tuple)
        kind, keys, position, has_gauss, cached = legacy
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), position, has_gauss, cached)
    return state


def set_rng_state(state: Mapping[str, object]) -> None:
    """Restore the random states `rng_state` returned."""
    python = state["python"]
    assert isinstance(python, tuple)
    version, internal, gauss = python
    random.setstate((version, tuple(internal), gauss))
    torch_state = state["torch"]
    assert isinstance(torch_state, torch.Tensor)
    torch.set_rng_state(torch_state.cpu())
    cuda = state.get("cuda")
    if isinstance(cuda, list) and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    numpy_state = state.get("numpy")
    if isinstance(numpy_state, tuple) and is_module_available("numpy"):
        import numpy  # noqa: PLC0415 (optional)

        kind, keys, position, has_gauss, cached = numpy_state
        assert isinstance(keys, torch.Tensor)
        numpy.random.set_state(
            (kind, keys.cpu().numpy().astype("uint32"), position, has_gauss, cached)
        )


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Run the block without changing the random states seen after it.

    Validation inside training runs in it: a run with validation draws the same
    training randomness as one without, and resuming stays exact.
    """
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)
