"""Bundled examples that `plait fit --example NAME` trains."""

from plait.trainer.examples.registry import EXAMPLES, Example

__all__ = ["EXAMPLES", "Example"]
