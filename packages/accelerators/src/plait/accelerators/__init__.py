"""Accelerators: the kinds of device a strategy runs on.

CPU, CUDA, MPS and XLA devices, each meeting the `plait.core.Accelerator`
protocol and registered by name in `plait.core.AcceleratorRegistry`.

This distribution ships no accelerator yet: it installs and imports on its own,
and registers nothing.
"""
