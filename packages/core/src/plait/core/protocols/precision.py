"""The Precision protocol: numeric formats for parameters, activations and gradients."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    import torch

    from plait.core.typing import StateDict

__all__ = ["GradientClipAlgorithm", "Precision"]

ModuleT = TypeVar("ModuleT", bound="torch.nn.Module")
T = TypeVar("T")

GradientClipAlgorithm = Literal["norm", "value"]
"""How `Precision.clip_gradients` clips: by total norm, or each value."""


@runtime_checkable
class Precision(Protocol):
    """A numeric format ("32-true", "bf16-mixed", ...) and the steps that depend on it.

    Its dtypes are public, so that a strategy which casts or reduces by itself (a
    sharding strategy's mixed-precision policy, say) derives that from any plugin.
    """

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype parameters are stored (and updated) in."""
        ...

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the forward and backward passes compute in."""
        ...

    @property
    def reduce_dtype(self) -> torch.dtype:
        """The dtype gradients are reduced across ranks in."""
        ...

    @property
    def needs_scaler(self) -> bool:
        """Whether the loss is scaled before backward (float16 training)."""
        ...

    def convert_module(self, module: ModuleT) -> ModuleT:
        """Cast a module's parameters and buffers as the format requires, in place."""
        ...

    def forward_context(self) -> AbstractContextManager[object]:
        """The context to run forward passes in (e.g. autocast)."""
        ...

    def convert_input(self, data: T) -> T:
        """Cast the floating tensors in ``data`` (any nesting) to the input dtype."""
        ...

    def convert_output(self, data: T) -> T:
        """Cast the floating tensors in ``data`` back to the default dtype."""
        ...

    def backward(self, tensor: torch.Tensor, module: torch.nn.Module | None) -> None:
        """Compute gradients of ``tensor`` (scaled, if the format needs it)."""
        ...

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], object] | None = None,
    ) -> object:
        """Step ``optimizer`` (unscaling first; skipping the step on inf/nan if fp16).

        Returns:
            What ``optimizer.step`` returned, or ``None`` when the step was skipped.
        """
        ...

    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> torch.Tensor | None:
        """Clip the gradients of ``optimizer``'s parameters, unscaled first.

        Returns:
            By norm, the gradients' total norm before clipping where the plugin
            knows it; otherwise ``None``.
        """
        ...

    def state_dict(self) -> StateDict:
        """The plugin's state for a checkpoint (e.g. the gradient scaler's)."""
        ...

    def load_state_dict(self, state_dict: StateDict) -> None:
        """Restore the state returned by `state_dict`."""
        ...
