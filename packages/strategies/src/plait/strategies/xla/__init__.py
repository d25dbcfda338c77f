"""The XLA strategies, on torch_xla (the ``plait-strategies[xla]`` extra).

torch_xla is imported when a strategy is made, never by ``import plait.strategies``.
"""

from plait.strategies.xla.fsdp import XLAFSDPStrategy
from plait.strategies.xla.launcher import XLALauncher
from plait.strategies.xla.replicas import XLAStrategy
from plait.strategies.xla.single import SingleDeviceXLAStrategy

__all__ = ["SingleDeviceXLAStrategy", "XLAFSDPStrategy", "XLALauncher", "XLAStrategy"]
