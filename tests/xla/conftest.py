"""The XLA lane: these tests run in the lane's own environment (``tools/check xla``).

torch_xla works only beside the torch release it was built for, so the lane has a
virtualenv of its own (``tools/xla-env``), with ``PJRT_DEVICE=CPU``: XLA on the CPU.
Elsewhere, each test is skipped, saying so. Tests marked ``tpu`` need several XLA
replicas, which torch_xla cannot join on the CPU: they run on a TPU host only
(``PJRT_DEVICE=TPU``), and are skipped elsewhere with the upstream reason.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

LANE = "run them in the XLA lane: tools/check xla"


TPU_LANE = (
    "needs several XLA replicas, which only a TPU host runs here: on XLA:CPU, "
    "collectives across replicas are not supported by torch_xla (pytorch/xla issue 9089). "
    "On a TPU host: PJRT_DEVICE=TPU python -m pytest -m tpu tests/xla"
)


def _on_tpu() -> bool:
    return os.environ.get("PJRT_DEVICE", "").upper() == "TPU"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the XLA tests where torch_xla is not installed, and the TPU lane off a TPU."""
    mine = [item for item in items if item.path.is_relative_to(config.rootpath / "tests" / "xla")]
    if importlib.util.find_spec("torch_xla") is None:
        skip = pytest.mark.skip(reason=f"needs torch_xla, which is not installed: {LANE}")
        for item in mine:
            item.add_marker(skip)
        return
    if not _on_tpu():
        skip_tpu = pytest.mark.skip(reason=TPU_LANE)
        for item in mine:
            if "tpu" in item.keywords:
                item.add_marker(skip_tpu)
