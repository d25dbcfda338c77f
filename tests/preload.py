"""What the test processes' fork server imports once, so that no rank imports it again.

Named by the ``plait_preload`` ini option (pyproject.toml): the conformance lanes'
rank pools and the scripts of `tests.warm` are forks of that one server per test
process. Beyond torch and plait's strategies and Trainer, it holds what their ranks
would otherwise each import at their first step: DeepSpeed (0.25 s of CPU,
told to use the CPU, as plait's strategy tells it on a CPU machine) and the ZeRO
optimizer support it imports at a first optimizer (as much again). On a build of
torch for an accelerator, DeepSpeed is left to each rank, whose device decides
DeepSpeed's accelerator at its first import.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Final

from tests.warm import ZERO_OPTIMIZERS, preloads_deepspeed

from plait.strategies.deepspeed import library

__all__ = ["MODULES"]

MODULES: Final = (
    "torch",
    "torch.distributed",
    "plait.strategies",
    "plait.strategies.ddp",
    "plait.strategies.fsdp",
    "plait.strategies.model_parallel",
    "plait.strategies.deepspeed.strategy",
    "plait.trainer",
)
"""What the tests' ranks and scripts import, whatever their strategy."""

for _module in MODULES:
    importlib.import_module(_module)
if preloads_deepspeed():
    library.import_deepspeed("cpu")
    if importlib.util.find_spec(ZERO_OPTIMIZERS) is not None:
        importlib.import_module(ZERO_OPTIMIZERS)
