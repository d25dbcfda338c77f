"""The XLA lane: these tests run in the lane's own environment (``tools/check xla``).

torch_xla works only beside the torch release it was built for, so the lane has a
virtualenv of its own (``tools/xla-env``), with ``PJRT_DEVICE=CPU``: XLA on the CPU.
Elsewhere, each test is skipped, saying so.
"""

from __future__ import annotations

import importlib.util

import pytest

LANE = "run them in the XLA lane: tools/check xla"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the XLA tests where torch_xla is not installed."""
    if importlib.util.find_spec("torch_xla") is not None:
        return
    skip = pytest.mark.skip(reason=f"needs torch_xla, which is not installed: {LANE}")
    for item in items:
        if item.path.is_relative_to(config.rootpath / "tests" / "xla"):
            item.add_marker(skip)
