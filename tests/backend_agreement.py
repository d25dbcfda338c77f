"""DDP whose ranks agree on every checked call through the process group at any size.

``auto`` takes that path only above `STORE_CROSSOVER` ranks; the conformance suite
runs this strategy at 1 to 4 ranks to prove the path keeps the contract there too
(``test_conformance_strategies.py``).
"""

from __future__ import annotations

from plait.strategies import DDPStrategy


def ddp_agreeing_through_the_process_group() -> DDPStrategy:
    """DDP on the CPU, agreeing through the process group whatever the world size."""
    strategy = DDPStrategy(accelerator="cpu")
    strategy.check_agreement = "backend"
    return strategy
