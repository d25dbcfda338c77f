"""Precision plugins: the numeric formats of training.

``"32-true"``, ``"64-true"``, ``"16-true"`` and ``"bf16-true"`` (`TruePrecision`),
``"16-mixed"`` and ``"bf16-mixed"`` (`MixedPrecision`), each meeting the
`plait.core.Precision` protocol and registered by name, with the aliases ``32``,
``64``, ``16`` and ``"bf16"``, in `plait.core.PrecisionRegistry`.
"""

from plait.precision.base import LEAF_TYPES, map_tensors
from plait.precision.names import ALIASES, PRECISIONS, parse_precision
from plait.precision.plugins import MixedPrecision, TruePrecision

__all__ = [
    "ALIASES",
    "LEAF_TYPES",
    "PRECISIONS",
    "MixedPrecision",
    "TruePrecision",
    "map_tensors",
    "parse_precision",
]
