"""Registers the built-in precision formats (entry point ``plait.precision``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plait.precision.names import ALIASES
from plait.precision.plugins import MixedPrecision, TruePrecision

if TYPE_CHECKING:
    from plait.core import Precision, Registry

__all__ = ["register"]


def register(registry: Registry[Precision]) -> None:
    """Register every format under its full name and its alias.

    Each factory takes ``device_type=`` (``"cpu"`` by default), the device the model
    runs on: ``PrecisionRegistry.get("16-mixed", device_type="cuda")``.
    """
    formats = {
        "32-true": (TruePrecision, torch.float32, "float32 throughout"),
        "64-true": (TruePrecision, torch.float64, "float64 throughout"),
        "16-true": (TruePrecision, torch.float16, "float16 throughout"),
        "bf16-true": (TruePrecision, torch.bfloat16, "bfloat16 throughout"),
        "16-mixed": (MixedPrecision, torch.float16, "float32 weights, float16 autocast, scaler"),
        "bf16-mixed": (MixedPrecision, torch.bfloat16, "float32 weights, bfloat16 autocast"),
    }
    for name, (plugin, dtype, description) in formats.items():
        registry.register(name, plugin, description=description, dtype=dtype)
    for alias, name in ALIASES.items():
        plugin, dtype, description = formats[name]
        registry.register(
            alias, plugin, description=f"{description} (alias of {name})", dtype=dtype
        )
