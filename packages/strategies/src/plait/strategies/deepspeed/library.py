"""The DeepSpeed library, imported on first use, without compiling anything.

DeepSpeed JIT-compiles C++ ops the first time they are used (minutes each). The
strategy uses none that need compiling: the optimizer is the user's torch optimizer,
and the shared-memory collective op DeepSpeed builds when it joins a CPU process
group is left out (collectives go through torch.distributed's gloo). An op that the
user's configuration asks for (DeepSpeed's own ``Adam`` offloaded, say) still
compiles; a compilation killed half-way leaves a lock file in the extensions
directory that makes every later one wait forever, and `check_extension_locks`
names it instead.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, cast

from plait.core import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from contextlib import AbstractContextManager
    from types import ModuleType

    import torch

__all__ = [
    "EXTRA",
    "LIBRARY_NOTICES",
    "UNUSED_IMPORTS",
    "DeepSpeed",
    "check_extension_locks",
    "configure_activation_checkpointing",
    "extensions_dir",
    "import_deepspeed",
    "import_submodule",
    "is_available",
    "quiet",
    "require_async_io",
    "require_deepspeed",
    "skip_shared_memory_op",
]

EXTRA: Final = "plait-strategies[deepspeed]"

# A lock younger than this may belong to a compilation under way.
STALE_LOCK_AGE: Final = 15 * 60.0


def is_available() -> bool:
    """Whether deepspeed is installed (without importing it)."""
    return importlib.util.find_spec("deepspeed") is not None


def require_deepspeed() -> None:
    """Refuse early, naming the extra, when deepspeed is not installed.

    Raises:
        ConfigurationError: deepspeed cannot be imported.
    """
    if not is_available():
        raise ConfigurationError(
            "the DeepSpeed strategies need the deepspeed library, which is not installed",
            value="deepspeed",
            fix=f"pip install '{EXTRA}'",
        )


def require_async_io() -> None:
    """Refuse NVMe offload early where DeepSpeed's async_io op cannot be built.

    Raises:
        ConfigurationError: The op is not compatible here (libaio is missing).
    """
    builder = import_submodule("ops.op_builder").AsyncIOBuilder()
    if not builder.is_compatible(verbose=False):
        raise ConfigurationError(
            "offloading to NVMe needs DeepSpeed's async_io op, which cannot be built "
            "here (it needs libaio and its headers)",
            value="nvme",
            fix="install libaio (apt install libaio-dev) and let DeepSpeed build the op, "
            "or offload to the CPU (offload_*_device='cpu')",
        )


def configure_activation_checkpointing(config: Mapping[str, object]) -> None:
    """Tell ``deepspeed.checkpointing`` the config's activation checkpointing options.

    What ``deepspeed.checkpointing.checkpoint`` in the model reads.
    """
    checkpointing = import_submodule("runtime.activation_checkpointing.checkpointing")
    checkpointing.configure(mpu_=None, deepspeed_config=dict(config))


class ZeroModule(Protocol):
    """``deepspeed.zero``: what the strategy uses of it."""

    def Init(  # noqa: N802 (DeepSpeed's name)
        self, *, config_dict_or_path: object, remote_device: str | None
    ) -> AbstractContextManager[object]:
        """Partition the parameters of modules made inside, as they are made."""
        ...

    def GatheredParameters(  # noqa: N802 (DeepSpeed's name)
        self, params: Sequence[torch.nn.Parameter], modifier_rank: int | None = None
    ) -> AbstractContextManager[object]:
        """Gather partitioned parameters whole for the block (re-partitioned after)."""
        ...


class CommModule(Protocol):
    """``deepspeed.comm``: what the strategy uses of it."""

    def destroy_process_group(self) -> None:
        """Destroy the process groups, and DeepSpeed's references to them."""
        ...


class DeepSpeed(Protocol):
    """The ``deepspeed`` module: what the strategy uses of it."""

    @property
    def zero(self) -> ZeroModule:
        """``deepspeed.zero``."""
        ...

    @property
    def comm(self) -> CommModule:
        """``deepspeed.comm``."""
        ...

    def initialize(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        config: Mapping[str, object],
        dist_init_required: bool,
    ) -> tuple[object, ...]:
        """Make the engine: ``(engine, optimizer, dataloader, lr_scheduler)``."""
        ...

    def init_distributed(self, *, dist_backend: str, dist_init_required: bool) -> None:
        """Bind DeepSpeed's communication layer to torch.distributed's default group."""
        ...


_ACCELERATORS: Final = {"cpu": "cpu", "cuda": "cuda", "xpu": "xpu", "mps": "mps"}


UNUSED_IMPORTS: Final = ("mlflow",)
"""What DeepSpeed's import brings in for its autotuner alone (``deepspeed --autotuning``,
which runs in DeepSpeed's launcher, never in a rank): `import_deepspeed` hides these from
it. Where installed, MLflow's import is most of DeepSpeed's (0.9 of 1.3 CPU-s, each rank)."""


@contextlib.contextmanager
def _hidden(names: Sequence[str]) -> Iterator[None]:
    # ``import name`` raises ImportError meanwhile (for those not imported yet), as if
    # not installed; afterwards they import as usual.
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment] # Python's "not importable" mark
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def import_deepspeed(device_type: str | None = None) -> DeepSpeed:
    """``import deepspeed``, without its compiled shared-memory op or its autotuner's imports.

    What DeepSpeed imports for its autotuner alone (`UNUSED_IMPORTS`) is hidden from
    its first import, unless imported already.

    Args:
        device_type: The strategy's device type: DeepSpeed is told to use it (it
            otherwise guesses, and picks CUDA wherever a GPU is visible), unless
            ``DS_ACCELERATOR`` says otherwise. Only the first import decides.

    Raises:
        ConfigurationError: deepspeed is not installed (the extra is named).
    """
    require_deepspeed()
    already = "deepspeed" in sys.modules
    if not already and device_type in _ACCELERATORS:
        os.environ.setdefault("DS_ACCELERATOR", _ACCELERATORS[device_type])
    with _hidden(() if already else UNUSED_IMPORTS):
        module = importlib.import_module("deepspeed")
    # Also when the user's code imported deepspeed first: the op would build at the
    # first process group (minutes, and it fails to link without libaio).
    skip_shared_memory_op()
    return cast("DeepSpeed", module)


def import_submodule(name: str) -> ModuleType:
    """``import deepspeed.<name>`` (after `import_deepspeed`), e.g. ``utils.zero_to_fp32``.

    For work on the CPU (reading checkpoints): a first import tells DeepSpeed so.
    """
    import_deepspeed("cpu")
    return importlib.import_module(f"deepspeed.{name}")


def skip_shared_memory_op() -> None:
    """Have DeepSpeed's torch backend skip building its shared-memory collective op.

    Where DeepSpeed's backend module has no such builder (another version), nothing
    is replaced.
    """
    # Through sys.modules: `import deepspeed.comm.torch as x` binds PyTorch's torch.
    backend = importlib.import_module("deepspeed.comm.torch")
    if callable(getattr(backend, "build_shm_op", None)):
        setattr(backend, "build_shm_op", _no_op)  # noqa: B010 (mypy cannot see the module's)


def _no_op() -> None:
    return None


def extensions_dir() -> Path:
    """Where torch keeps JIT-compiled extensions (``TORCH_EXTENSIONS_DIR``, or its default)."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torch_extensions"


def check_extension_locks(
    directory: Path | None = None, *, stale_after: float = STALE_LOCK_AGE, remove: bool = False
) -> list[Path]:
    """Find lock files left by compilations that died, and remove or name them.

    A lock older than ``stale_after`` seconds belongs to no compilation still under
    way (each takes minutes), and makes the next one wait forever.

    Args:
        directory: The extensions directory (`extensions_dir` by default).
        stale_after: The age, in seconds, from which a lock is stale.
        remove: Remove stale locks (for a directory no other job shares) instead
            of raising.

    Returns:
        The stale locks removed.

    Raises:
        ConfigurationError: A stale lock was found and ``remove`` is false; it is named.
    """
    root = directory if directory is not None else extensions_dir()
    if not root.is_dir():
        return []
    now = time.time()
    stale = []
    for lock in root.glob("**/lock"):
        try:
            age = now - lock.stat().st_mtime
        except FileNotFoundError:  # its compilation just finished
            continue
        if age >= stale_after:
            stale.append(lock)
    if stale and not remove:
        raise ConfigurationError(
            f"a stale lock from a C++ extension build that died is in the way: "
            f"{stale[0]} (left {int((now - stale[0].stat().st_mtime) // 60)} minutes ago); "
            "DeepSpeed would wait for it forever",
            value=str(stale[0]),
            fix=f"remove {stale[0]} (no build is using it), or set TORCH_EXTENSIONS_DIR "
            "to a directory of this job's own",
        )
    for lock in stale:
        lock.unlink(missing_ok=True)
    return stale


# The notices torch gives DeepSpeed's own calls, at every step (ZeRO-3: hundreds a
# run): its collectives by their old names. A user of the strategy cannot act on
# them; DeepSpeed's maintainers can. Only these, and only inside plait's calls into
# DeepSpeed, are hidden; every other warning, the user's own above all, is shown.
LIBRARY_NOTICES: Final = (
    (
        FutureWarning,
        r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
    ),
)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Inside it, `LIBRARY_NOTICES` are not shown; any other warning is."""
    with warnings.catch_warnings():
        for category, message in LIBRARY_NOTICES:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield
