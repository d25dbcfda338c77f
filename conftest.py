"""Settings shared by every test in the repository.

Hypothesis profiles: ``default`` is fast, for the edit-test loop; ``ci`` is thorough,
and ``tools/check`` selects it when the CI variable is set. Choose one with
``pytest --hypothesis-profile=ci``. Neither sets a deadline: on shared machines a
per-example time limit fails tests for the machine's load, not for the code.
"""

import pytest
import torch
from hypothesis import HealthCheck, settings

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
