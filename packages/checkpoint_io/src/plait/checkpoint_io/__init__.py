"""Checkpoint I/O: how checkpoints are written and read.

Atomic torch checkpoints, asynchronous saving and distributed (sharded)
checkpoints, each meeting the `plait.core.CheckpointIO` protocol.

This distribution ships no implementation yet: it installs and imports on its
own, and registers nothing.
"""
