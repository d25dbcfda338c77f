"""The lanes: the backends the suite runs on, and what each one's devices can hold.

A lane is a backend of the pool's ranks (``gloo`` on the CPU, ``gloo-cuda``,
``nccl``, ``xla``); `plait.conformance.plugin.Lane` is one group of the suite's
tests, a strategy on a lane at a world size.
"""

from __future__ import annotations

from typing import Final

import torch

from plait.core import ConfigurationError

__all__ = ["LANES", "RANK_THREADS", "UNHELD_DTYPES", "backend_unavailable"]

LANES: Final = {"gloo": "cpu", "gloo-cuda": "cuda", "nccl": "cuda", "xla": "xla"}
"""Each backend lane and the device type its ranks must run on.

``gloo-cuda`` is gloo with the ranks' tensors on CUDA devices, which ranks may share:
it runs several ranks on a machine of one GPU. Its strategies choose their devices
and the gloo backend themselves (a factory reads ``PLAIT_CONFORMANCE_BACKEND``).
"""

RANK_THREADS: Final = 1
"""The intra-op threads each rank of a pool computes on (its ``OMP_NUM_THREADS``).

Several ranks share a machine's cores: more threads each would only wait on one
another. The training kit computes its references on as many, since a kernel may sum
in another order on another number of threads.
"""

UNHELD_DTYPES: Final[dict[str, dict[str, str]]] = {
    "xla": {
        "complex128": (
            "torch_xla 2.9 loses complex128 values on the way to the device (they "
            "arrive as 0), before any collective runs"
        ),
    },
}
"""Per lane, the dtypes its devices cannot hold, and why: no example uses them there."""


def backend_unavailable(backend: str, world_size: int) -> str | None:
    """Why the ``backend`` lane cannot run ``world_size`` ranks here, or ``None`` if it can.

    Raises:
        ConfigurationError: ``backend`` is not a lane.
    """
    if backend not in LANES:
        raise ConfigurationError.invalid_choice("backend", backend, tuple(LANES))
    if backend == "nccl":
        count = torch.cuda.device_count()
        if count < world_size:
            devices = "a CUDA device" if world_size == 1 else f"{world_size} CUDA devices"
            return f"the nccl lane needs {devices}: this machine has {count}"
    if backend == "gloo-cuda" and torch.cuda.device_count() == 0:
        return "the gloo-cuda lane needs a CUDA device, which its ranks share: this machine has 0"
    if backend == "xla":
        import importlib.util  # noqa: PLC0415 - only the XLA lane asks

        if importlib.util.find_spec("torch_xla") is None:
            return "the xla lane needs torch_xla, which is not installed"
    return None
