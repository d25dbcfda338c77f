"""What the test processes' fork server imports once, so that no rank imports it again.

Named by the ``plait_preload`` ini option (pyproject.toml): the conformance lanes'
rank pools and the scripts of `tests.warm` are forks of that one server per test
process. Beyond torch and plait's strategies and Trainer, it holds what their ranks
would otherwise each import at their first step: DeepSpeed (about 1.2 s of CPU,
told to use the CPU, as plait's strategy tells it on a CPU machine) and the ZeRO
optimizer support it imports at a first optimizer (as much again). On a build of
torch for an accelerator, DeepSpeed is left to each rank, whose device decides
DeepSpeed's accelerator at its first import.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Final

import torch

from plait.strategies.deepspeed import library

__all__ = ["MODULES", "ZERO_OPTIMIZERS", "cpu_only"]

MODULES: Final = (
    "torch.distributed",
    "plait.strategies",
    "plait.strategies.ddp",
    "plait.strategies.fsdp",
    "plait.strategies.model_parallel",
    "plait.strategies.deepspeed.strategy",
    "plait.trainer",
)
"""What the tests' ranks and scripts import, whatever their strategy."""

ZERO_OPTIMIZERS: Final = "deepspeed.runtime.zero.muon.muon_optimizer"
"""What DeepSpeed imports when it first checks an optimizer (``is_zero_supported_optimizer``)."""


def cpu_only() -> bool:
    """Whether this torch was built for the CPU alone (no CUDA, no ROCm)."""
    return torch.version.cuda is None and torch.version.hip is None


for _module in MODULES:
    importlib.import_module(_module)
if cpu_only() and library.is_available():
    library.import_deepspeed("cpu")
    if importlib.util.find_spec(ZERO_OPTIMIZERS) is not None:
        importlib.import_module(ZERO_OPTIMIZERS)
