"""The Strategy protocol: how a model is spread over processes and devices."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from typing_extensions import Self

from plait.core.protocols.collectives import Collectives

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from contextlib import AbstractContextManager

    import torch

    from plait.core.protocols.accelerator import Accelerator
    from plait.core.protocols.checkpoint_io import CheckpointIO
    from plait.core.protocols.launcher import Launcher
    from plait.core.protocols.precision import Precision
    from plait.core.typing import Checkpoint, PathLike

__all__ = ["Strategy", "SupportsLauncher", "SupportsNoSync", "SupportsReplace"]


@runtime_checkable
class Strategy(Collectives, Protocol):
    """Owns the module and optimizers across processes, and keeps the collective contract.

    Usable with or without the Trainer::

        strategy.setup_environment()
        model = strategy.setup_module(model)
        [optimizer] = strategy.setup_optimizers([optimizer])
        loss = model(batch).sum()
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer)
        strategy.teardown()
    """

    @property
    def accelerator(self) -> Accelerator:
        """The device kind the strategy runs on."""
        ...

    @property
    def precision(self) -> Precision:
        """The numeric format of the model and its gradients."""
        ...

    @property
    def checkpoint_io(self) -> CheckpointIO:
        """How checkpoints are written and read."""
        ...

    @property
    def root_device(self) -> torch.device:
        """This process's device: where its module and tensors live."""
        ...

    @property
    def world_size(self) -> int:
        """The number of processes in the job."""
        ...

    @property
    def global_rank(self) -> int:
        """This process's rank among all processes."""
        ...

    @property
    def is_global_zero(self) -> bool:
        """Whether this is the process of global rank 0."""
        ...

    def setup_environment(self) -> None:
        """Prepare the device and join the process group (once per process)."""
        ...

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move and wrap ``module`` for this strategy (e.g. in DDP); use what it returns."""
        ...

    def setup_optimizers(
        self, optimizers: Sequence[torch.optim.Optimizer]
    ) -> list[torch.optim.Optimizer]:
        """Prepare ``optimizers`` for this strategy; use what it returns, in the same order."""
        ...

    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None = None) -> None:
        """Compute gradients of ``loss`` through the precision plugin."""
        ...

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], object] | None = None,
    ) -> object:
        """Step ``optimizer`` through the precision plugin."""
        ...

    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Save ``checkpoint`` through the checkpoint IO (on the ranks that must write)."""
        ...

    def load_checkpoint(self, path: PathLike) -> Checkpoint:
        """Load the checkpoint at ``path`` onto this rank's device."""
        ...

    def on_exception(self, exception: BaseException) -> None:
        """React to an exception raised in the user's code (e.g. tell the peers).

        It may raise a clearer error in the exception's place, chained to it (a
        strategy naming the ranks a backend's timeout waited for, say).
        """
        ...

    def teardown(self) -> None:
        """Leave the process group and release devices; safe to call more than once."""
        ...


@runtime_checkable
class SupportsNoSync(Protocol):
    """A strategy that can skip gradient synchronisation on accumulation steps."""

    def no_sync(self, module: torch.nn.Module) -> AbstractContextManager[None]:
        """Inside this context, backward passes accumulate locally without communicating."""
        ...


@runtime_checkable
class SupportsLauncher(Protocol):
    """A strategy that starts its own processes (or joins externally started ones)."""

    @property
    def launcher(self) -> Launcher:
        """The launcher that runs the job's function on every rank."""
        ...


@runtime_checkable
class SupportsReplace(Protocol):
    """A strategy that can be made again with some of its constructor arguments changed.

    Strategies are not changed after construction: a trainer that must give one a
    precision, a device list or a cluster environment makes a new one with `replace`.
    """

    @property
    def arguments(self) -> Mapping[str, object]:
        """The keyword arguments it was made with (positional ones by their name)."""
        ...

    def accepts(self, argument: str) -> bool:
        """Whether its constructor takes the keyword ``argument``."""
        ...

    def replace(self, **changes: object) -> Self:
        """A new strategy made with `arguments`, ``changes`` replacing or adding to them."""
        ...
