"""Precision plugins: the numeric formats of training.

``"32-true"``, ``"64-true"``, ``"16-mixed"``, ``"bf16-mixed"``, ``"16-true"`` and
``"bf16-true"``, each meeting the `plait.core.Precision` protocol and
registered by name in `plait.core.PrecisionRegistry`.

This distribution ships no plugin yet: it installs and imports on its own,
and registers nothing.
"""
