"""What plait drives of DeepSpeed's engine, and what its checkpoint IO needs of the strategy.

Two Protocols at the bottom of the DeepSpeed family: `Engine`, the part of
``DeepSpeedEngine`` the strategy drives, and `EngineHost`, the part of the strategy
`plait.strategies.deepspeed.checkpoint_io.DeepSpeedCheckpointIO` reads, so that the
IO stands on them and the strategy on the IO, with no import back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from plait.core import Strategy

if TYPE_CHECKING:
    import torch


__all__ = ["Engine", "EngineHost"]


class Engine(Protocol):
    """The part of DeepSpeed's ``DeepSpeedEngine`` the strategy drives."""

    module: torch.nn.Module
    optimizer: object

    def __call__(self, *args: object, **kwargs: object) -> object:
        """The module's forward, through the engine."""
        ...

    def backward(self, loss: torch.Tensor) -> object:
        """The backward pass of ``loss`` (scaled, partitioned as the stage says)."""
        ...

    def step(self) -> None:
        """The optimizer's step (and the gradients' zeroing)."""
        ...

    def gradient_clipping(self) -> float:
        """The norm the engine clips to inside its step (0: none)."""
        ...

    def save_checkpoint(
        self,
        save_dir: str,
        tag: str | None = None,
        client_state: Mapping[str, object] = ...,
        save_latest: bool = ...,
        exclude_frozen_parameters: bool = ...,
    ) -> bool:
        """Write the engine's state under ``save_dir``/``tag``."""
        ...

    def load_checkpoint(
        self,
        load_dir: str,
        tag: str | None = None,
        load_module_strict: bool = True,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
    ) -> tuple[str | None, dict[str, object] | None]:
        """Read the engine's state back: the path loaded and the client state."""
        ...

    def destroy(self) -> None:
        """Release what the engine holds."""
        ...


class EngineHost(Strategy, Protocol):
    """What DeepSpeed's checkpoint IO reads of its strategy: a `Strategy` and its engine.

    `DeepSpeedStrategy` has it all.
    """

    @property
    def stage(self) -> int:
        """The ZeRO stage."""
        ...

    @property
    def exclude_frozen_parameters(self) -> bool:
        """Whether parameters that do not train are left out of checkpoints."""
        ...

    @property
    def engine(self) -> Engine:
        """The engine (after set-up)."""
        ...

    @property
    def has_optimizer(self) -> bool:
        """Whether the engine was made with an optimizer."""
        ...

    @property
    def optimizer_parameter_names(self) -> list[str]:
        """The names of the optimizer's parameters, in its order."""
        ...

    def load_whole_module_state(self, state: Mapping[str, object], *, source: object) -> None:
        """Load a whole state into the engine's module."""
        ...
