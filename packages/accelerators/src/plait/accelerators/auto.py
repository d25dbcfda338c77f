"""Choosing the best accelerator this machine has, among every registered one."""

from __future__ import annotations

from typing import Final

from plait.core import Accelerator, AcceleratorRegistry, PlaitError

__all__ = ["PREFERENCE", "auto_accelerator", "available_accelerators"]

PREFERENCE: Final = ("xla", "cuda", "mps")
"""The built-in accelerators ``"auto"`` prefers, best first, after any accelerator a
plugin registered (installed for its hardware) and before the CPU, which is last."""

_AUTO: Final = "auto"


def _candidates() -> list[Accelerator]:
    # Every registered accelerator once (aliases build the same one), best first.
    found: dict[str, Accelerator] = {}
    for name in AcceleratorRegistry.available():
        if name == _AUTO:
            continue
        try:
            accelerator = AcceleratorRegistry.get(name)
        except PlaitError:  # one that needs arguments to be made is never "auto"
            continue
        found.setdefault(accelerator.name, accelerator)

    def rank(accelerator: Accelerator) -> int:
        if accelerator.name == "cpu":
            return len(PREFERENCE) + 1
        if accelerator.name in PREFERENCE:
            return PREFERENCE.index(accelerator.name) + 1
        return 0  # a plugin's: chosen first

    return sorted(found.values(), key=rank)


def auto_accelerator() -> Accelerator:
    """The best registered accelerator available: a plugin's, XLA, CUDA, MPS, the CPU."""
    for accelerator in _candidates():
        if accelerator.is_available():
            return accelerator
    return AcceleratorRegistry.get("cpu")  # always available


def available_accelerators() -> list[str]:
    """The names of the registered accelerators available here, best first."""
    return [accelerator.name for accelerator in _candidates() if accelerator.is_available()]
