"""Accelerators: the kinds of device a strategy runs on.

CPU, CUDA, MPS and XLA devices, each meeting the :class:`plait.core.Accelerator`
protocol and registered by name in :data:`plait.core.AcceleratorRegistry`.

This distribution ships no accelerator yet: it installs and imports on its own,
and registers nothing.
"""
