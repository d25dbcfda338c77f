"""Strategies: how a model is spread over processes and devices.

Single device, the DDP family, FSDP, DeepSpeed and XLA, with their launchers, each
meeting the `plait.core.Strategy` protocol and registered by name in
`plait.core.StrategyRegistry`.

This distribution ships no strategy yet: it installs and imports on its own,
and registers nothing.
"""
