"""Settings shared by every test in the repository.

Hypothesis profiles: ``default`` is fast, for the edit-test loop; ``ci`` is thorough,
and ``tools/check`` selects it when the CI variable is set. Choose one with
``pytest --hypothesis-profile=ci``. Neither sets a deadline: on shared machines a
per-example time limit fails tests for the machine's load, not for the code.
"""

import os
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from plait.strategies.deepspeed.library import check_extension_locks

# C++ extensions (which DeepSpeed builds on first use of some ops) go to a directory of
# the tests' own, cleared of locks left by a build that died: a lock makes every later
# build wait for it forever. The strategies build none; this guards against one that would.
os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", str(Path(tempfile.gettempdir()) / "plait-tests-torch-extensions")
)
check_extension_locks(Path(os.environ["TORCH_EXTENSIONS_DIR"]), remove=True)

settings.register_profile("default", max_examples=60, deadline=None)
settings.register_profile(
    "ci",
    max_examples=600,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("default")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests of hardware lanes this machine lacks, saying why."""
    if torch.cuda.device_count() == 0:
        skip = pytest.mark.skip(reason="needs a CUDA device: this machine has none")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)
