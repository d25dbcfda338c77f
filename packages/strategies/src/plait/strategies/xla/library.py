"""torch_xla, imported on first use.

torch_xla's binary works beside the one torch release it was built for; importing it
beside another fails with an undefined symbol. Nothing in plait imports it until an
XLA strategy is made, and a failed import is reported with the fix.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Final, Protocol, cast

from plait.core import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    import torch

__all__ = [
    "EXTRA",
    "MULTI_REPLICA_CPU",
    "TorchXLA",
    "import_torch_xla",
    "is_available",
    "require_torch_xla",
    "runtime",
    "runtime_is_initialized",
    "spmd",
    "xla_model",
]

MULTI_REPLICA_CPU: Final = (
    "collectives across XLA:CPU replicas are not supported by torch_xla (they stall, "
    "then XLA aborts: pytorch/xla issue 9089)"
)
"""Why several XLA replicas cannot run on the CPU, in torch_xla's own terms."""

EXTRA: Final = "plait-strategies[xla]"


def is_available() -> bool:
    """Whether torch_xla is installed (without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def require_torch_xla() -> None:
    """Refuse early, naming the extra, when torch_xla is not installed.

    Raises:
        ConfigurationError: torch_xla is not installed.
    """
    if not is_available():
        raise ConfigurationError(
            "the XLA strategies need torch_xla, which is not installed",
            value="torch_xla",
            fix=(
                f"pip install '{EXTRA}' with the torch release torch_xla was built for "
                "(torch_xla 2.9 needs torch 2.9); tools/xla-env makes such an environment"
            ),
        )


class TorchXLA(Protocol):
    """``torch_xla``: what the strategies use of it."""

    def device(self, index: int | None = None) -> torch.device:
        """This process's XLA device."""
        ...

    def sync(self, wait: bool = False) -> None:
        """Cut the traced graph here and run it (and, with ``wait``, wait for it)."""
        ...


class DeviceLoader(Protocol):
    """``torch_xla.distributed.parallel_loader.MpDeviceLoader``, made."""

    def __iter__(self) -> Iterator[object]: ...

    def __len__(self) -> int: ...


class ParallelLoader(Protocol):
    """``torch_xla.distributed.parallel_loader``."""

    def MpDeviceLoader(  # noqa: N802 (torch_xla's name)
        self, loader: Iterable[object], device: torch.device
    ) -> DeviceLoader:
        """Wrap ``loader`` so batches are moved to ``device`` in the background."""
        ...


def import_torch_xla() -> TorchXLA:
    """Import torch_xla, explaining a missing or mismatched install.

    Raises:
        ConfigurationError: torch_xla is missing, or does not import beside this torch.
    """
    require_torch_xla()
    try:
        module = importlib.import_module("torch_xla")
    except (ImportError, OSError) as error:
        import torch  # noqa: PLC0415 - for the message only

        raise ConfigurationError(
            f"torch_xla is installed but does not import beside torch {torch.__version__}: "
            f"{type(error).__name__}: {error}",
            value="torch_xla",
            fix="install the torch release torch_xla was built for (tools/xla-env)",
        ) from error
    return cast("TorchXLA", module)


def parallel_loader() -> ParallelLoader:
    """``torch_xla.distributed.parallel_loader``."""
    import_torch_xla()
    module = importlib.import_module("torch_xla.distributed.parallel_loader")
    return cast("ParallelLoader", module)


class Runtime(Protocol):
    """``torch_xla.runtime``: what the strategies use of it."""

    def device_type(self) -> str | None:
        """``PJRT_DEVICE``'s device type (``"TPU"``, ``"CPU"``, ...)."""
        ...

    def global_runtime_device_count(self) -> int:
        """How many devices the job's runtime sees (in SPMD: every device of the mesh)."""
        ...

    def use_spmd(self) -> None:
        """Switch this process to SPMD: one program over every device."""
        ...

    def is_spmd(self) -> bool:
        """Whether this process is in SPMD mode."""
        ...


class XLAModel(Protocol):
    """``torch_xla.core.xla_model``: what the strategies use of it."""

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average the gradients ``optimizer`` holds across the replicas."""
        ...


class DeviceMesh(Protocol):
    """A ``torch_xla.distributed.spmd.Mesh``: devices laid out along named axes."""


class SPMD(Protocol):
    """``torch_xla.distributed.spmd``: what the strategies use of it."""

    def Mesh(  # noqa: N802 (torch_xla's name)
        self, device_ids: object, mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]
    ) -> DeviceMesh:
        """A mesh of ``device_ids`` in ``mesh_shape``."""
        ...

    def mark_sharding(
        self, tensor: torch.Tensor, mesh: DeviceMesh, partition_spec: tuple[str | None, ...]
    ) -> object:
        """Lay ``tensor`` out over ``mesh``: dimension i along ``partition_spec[i]``."""
        ...


def runtime() -> Runtime:
    """``torch_xla.runtime``."""
    import_torch_xla()
    return cast("Runtime", importlib.import_module("torch_xla.runtime"))


def runtime_is_initialized() -> bool:
    """Whether this process's XLA runtime has started (its devices are then fixed)."""
    import_torch_xla()
    bindings = importlib.import_module("torch_xla")._XLAC  # torch_xla's C++ bindings
    started: bool = bindings._xla_runtime_is_initialized()
    return started


def xla_model() -> XLAModel:
    """``torch_xla.core.xla_model``."""
    import_torch_xla()
    return cast("XLAModel", importlib.import_module("torch_xla.core.xla_model"))


def spmd() -> SPMD:
    """``torch_xla.distributed.spmd``."""
    import_torch_xla()
    return cast("SPMD", importlib.import_module("torch_xla.distributed.spmd"))


def require_xla_device(device: torch.device) -> None:
    """Refuse a device that is not an XLA device.

    Raises:
        ConfigurationError: Naming the device.
    """
    if device.type != "xla":
        raise ConfigurationError(
            f"an XLA strategy runs on an XLA device, not {str(device)!r}",
            value=str(device),
            fix="leave device unset (this process's XLA device) or pass 'xla:0'; for "
            "another device type, use its strategy (e.g. 'single_device')",
        )
