"""The precision plugins: true (one dtype throughout) and mixed (autocast)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Final, TypeVar

import torch
from typing_extensions import override

from plait.core import ConfigurationError, GradientClipAlgorithm, rank_zero_warn
from plait.precision.base import (
    check_clip,
    check_supported,
    convert_floats,
    default_dtype,
    parameters_with_gradients,
)

if TYPE_CHECKING:
    from plait.core.typing import StateDict

__all__ = ["ClippingHooks", "MixedPrecision", "TruePrecision"]

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)
T = TypeVar("T")

_TRUE_NAMES: Final = {
    torch.float32: "32-true",
    torch.float64: "64-true",
    torch.float16: "16-true",
    torch.bfloat16: "bf16-true",
}
_MIXED_NAMES: Final = {torch.float16: "16-mixed", torch.bfloat16: "bf16-mixed"}


_NOTHING: Final = contextlib.nullcontext()
"""A context that does nothing (reusable: it holds no state)."""


def _step(optimizer: torch.optim.Optimizer, closure: Callable[[], object] | None) -> object:
    # Some optimizers (PostLocalSGDOptimizer, for one) take no closure at all.
    if closure is None:
        return optimizer.step()
    return optimizer.step(closure)  # type: ignore[arg-type]


def _format(
    given: torch.dtype | str, allowed: dict[torch.dtype, str], kind: str
) -> tuple[torch.dtype, str]:
    # A plugin is made from a dtype or from the name users know ("bf16-mixed").
    if isinstance(given, str):
        by_name = {name: dtype for dtype, name in allowed.items()}
        dtype = by_name.get(given)
        if dtype is None:
            raise ConfigurationError.invalid_choice(f"{kind} precision", given, list(by_name))
        return dtype, given
    name = allowed.get(given)
    if name is None:
        raise ConfigurationError(
            f"{kind} precision has no format for {given}",
            value=given,
            choices=[str(choice) for choice in allowed] + list(allowed.values()),
        )
    return given, name


class ClippingHooks:
    """Clipping by algorithm through one overridable hook each, as Lightning's plugins have."""

    def clip_by(
        self, optimizer: torch.optim.Optimizer, clip_val: float, algorithm: GradientClipAlgorithm
    ) -> torch.Tensor | None:
        """Clip with the hook of ``algorithm``: `clip_grad_by_norm` or `clip_grad_by_value`.

        Returns:
            What `clip_grad_by_norm` returned (the total norm before clipping), or
            ``None`` by value.
        """
        if algorithm == "norm":
            return self.clip_grad_by_norm(optimizer, clip_val)
        self.clip_grad_by_value(optimizer, clip_val)
        return None

    def clip_grad_by_norm(
        self, optimizer: torch.optim.Optimizer, clip_val: float
    ) -> torch.Tensor | None:
        """Scale the gradients down to a total norm of ``clip_val`` (a hook to override).

        Returns:
            The gradients' total norm before clipping (an override may return ``None``).
        """
        return torch.nn.utils.clip_grad_norm_(parameters_with_gradients(optimizer), clip_val)

    def clip_grad_by_value(self, optimizer: torch.optim.Optimizer, clip_val: float) -> None:
        """Clamp each gradient to ``[-clip_val, clip_val]`` (a hook to override)."""
        torch.nn.utils.clip_grad_value_(parameters_with_gradients(optimizer), clip_val)


class TruePrecision(ClippingHooks):
    """Parameters, inputs and computation in one dtype.

    The formats ``"32-true"``, ``"64-true"``, ``"16-true"`` and ``"bf16-true"``.
    The module is cast to the dtype, floating inputs too, and new floating tensors
    made during the forward pass default to it. Outputs come back in the default
    dtype (float32) so that losses and metrics read the same everywhere.

    Args:
        dtype: The dtype of everything, or the format's name (``"bf16-true"``).
        device_type: The device the model runs on, checked against the format.

    Raises:
        ConfigurationError: No such format, or the device cannot run it.
    """

    def __init__(
        self, dtype: torch.dtype | str = torch.float32, *, device_type: str = "cpu"
    ) -> None:
        self.dtype, self.name = _format(dtype, _TRUE_NAMES, "true")
        check_supported(self.name, device_type)
        self.device_type = device_type

    @property
    def param_dtype(self) -> torch.dtype:
        """Parameters are stored in the dtype."""
        return self.dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        """The forward pass runs in the dtype."""
        return self.dtype

    @property
    def reduce_dtype(self) -> torch.dtype:
        """Gradients are the parameters' dtype, and reduced in it."""
        return self.dtype

    @property
    def needs_scaler(self) -> bool:
        """No true format scales its loss."""
        return False

    def convert_module(self, module: ModuleT) -> ModuleT:
        """Cast the module's floating parameters and buffers to the dtype, in place."""
        return module.to(self.dtype)

    def forward_context(self) -> AbstractContextManager[object]:
        """New floating tensors default to the dtype inside the block."""
        if torch.get_default_dtype() == self.dtype:  # the usual case: nothing to set
            return _NOTHING
        return default_dtype(self.dtype)

    def tensor_init_context(self) -> AbstractContextManager[object]:
        """New floating tensors are made in the dtype; the default is restored after.

        As Lightning's true-precision plugins: a module built inside is in the
        dtype from the start, never made in float32 first.
        """
        return self.forward_context()

    def module_init_context(self) -> AbstractContextManager[object]:
        """The same as `tensor_init_context`, for a module's construction."""
        return self.tensor_init_context()

    def convert_input(self, data: T) -> T:
        """Cast floating tensors in ``data`` to the dtype."""
        return convert_floats(data, self.dtype)

    def convert_output(self, data: T) -> T:
        """Cast floating tensors in ``data`` to the default dtype."""
        return convert_floats(data, torch.get_default_dtype())

    def backward(self, tensor: torch.Tensor, module: torch.nn.Module | None) -> None:
        """Compute gradients of ``tensor``."""
        torch.autograd.backward(tensor)

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], object] | None = None
    ) -> object:
        """Step ``optimizer``; returns what its ``step`` returned."""
        if closure is None:  # the usual step, without a call more (as `_step`)
            return optimizer.step()
        return optimizer.step(closure)  # type: ignore[arg-type]

    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> torch.Tensor | None:
        """Clip by total norm (`clip_grad_by_norm`) or by value (`clip_grad_by_value`).

        ``clip_val`` 0 clips nothing, as in Lightning.

        Returns:
            By norm, the total norm before clipping; ``None`` by value or unclipped.
        """
        if not check_clip(clip_val, algorithm):
            return None
        return self.clip_by(optimizer, clip_val, algorithm)

    def state_dict(self) -> StateDict:
        """Nothing to save: the format has no state."""
        return {}

    def load_state_dict(self, state_dict: StateDict) -> None:
        """Nothing to restore."""

    @override
    def __repr__(self) -> str:
        return f"TruePrecision({self.name!r}, device_type={self.device_type!r})"


class MixedPrecision(ClippingHooks):
    """Parameters in float32, computation autocast to float16 or bfloat16.

    The formats ``"16-mixed"`` and ``"bf16-mixed"``.
    With float16, a gradient scaler keeps small gradients from vanishing: the loss
    is scaled before backward, gradients are unscaled before clipping and stepping,
    and a step whose gradients hold inf or nan is skipped (the scale then shrinks).
    bfloat16 has float32's range and needs no scaler.

    Args:
        dtype: ``torch.float16`` or ``torch.bfloat16``, or the format's name
            (``"16-mixed"``, ``"bf16-mixed"``).
        device_type: The device type autocast runs for (``"cuda"``, ``"cpu"``, ...).
        scaler: The gradient scaler to use with float16; one for ``device_type`` by
            default.

    Raises:
        ConfigurationError: No such format, the device cannot run it, or a scaler
            was given for bfloat16.
    """

    def __init__(
        self,
        dtype: torch.dtype | str = torch.bfloat16,
        *,
        device_type: str = "cpu",
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        dtype, self.name = _format(dtype, _MIXED_NAMES, "mixed")
        check_supported(self.name, device_type)
        if dtype == torch.bfloat16 and scaler is not None:
            raise ConfigurationError(
                "bf16-mixed needs no gradient scaler: bfloat16 has the range of float32",
                value=scaler,
                fix="drop the scaler, or use precision='16-mixed'",
            )
        if dtype == torch.float16 and scaler is None:
            scaler = torch.amp.GradScaler(device_type)
        self.dtype = dtype
        self.device_type = device_type
        self.scaler = scaler

    @property
    def param_dtype(self) -> torch.dtype:
        """Parameters stay in float32."""
        return torch.float32

    @property
    def compute_dtype(self) -> torch.dtype:
        """Autocast runs the forward pass in float16 or bfloat16."""
        return self.dtype

    @property
    def reduce_dtype(self) -> torch.dtype:
        """Gradients are float32, like the parameters, and reduced so."""
        return torch.float32

    @property
    def needs_scaler(self) -> bool:
        """float16 scales its loss; bfloat16 has float32's range and does not."""
        return self.scaler is not None

    def convert_module(self, module: ModuleT) -> ModuleT:
        """Leave the parameters in float32: autocast casts per operation."""
        return module

    def forward_context(self) -> AbstractContextManager[object]:
        """Autocast to the dtype for ``device_type``."""
        return torch.autocast(self.device_type, dtype=self.dtype)

    def autocast_context_manager(self) -> AbstractContextManager[object]:
        """`forward_context`, under the name Lightning's mixed precision gives it."""
        return self.forward_context()

    def tensor_init_context(self) -> AbstractContextManager[object]:
        """Nothing: the parameters stay float32, autocast casts per operation."""
        return _NOTHING

    def module_init_context(self) -> AbstractContextManager[object]:
        """Nothing, as `tensor_init_context`."""
        return _NOTHING

    def convert_input(self, data: T) -> T:
        """Cast floating tensors to the default dtype; autocast casts from there."""
        return convert_floats(data, torch.get_default_dtype())

    def convert_output(self, data: T) -> T:
        """Cast floating tensors to the default dtype."""
        return convert_floats(data, torch.get_default_dtype())

    def backward(self, tensor: torch.Tensor, module: torch.nn.Module | None) -> None:
        """Compute gradients of ``tensor``, scaled first with float16."""
        if self.scaler is not None:
            tensor = self.scaler.scale(tensor)
        torch.autograd.backward(tensor)

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], object] | None = None
    ) -> object:
        """Step ``optimizer``: with float16, unscaled, and skipped on inf or nan.

        Returns:
            What ``optimizer.step`` returned, or ``None`` when the step was skipped.
        """
        if self.scaler is None:
            return _step(optimizer, closure)
        # The scaler cannot pass a closure to the optimizer: run it first, so that
        # the gradients it computes are the ones the scaler checks.
        if closure is not None:
            closure()
        result = self.scaler.step(optimizer)
        self.scaler.update()
        return result

    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> torch.Tensor | None:
        """Clip by total norm or value (`clip_grad_by_norm`, `clip_grad_by_value`), unscaled.

        ``clip_val`` 0 clips nothing, as in Lightning.

        Returns:
            By norm, the unscaled total norm before clipping; ``None`` by value or
            unclipped.
        """
        if not check_clip(clip_val, algorithm):
            return None
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        return self.clip_by(optimizer, clip_val, algorithm)

    def state_dict(self) -> StateDict:
        """The gradient scaler's state, if there is a scaler."""
        return {} if self.scaler is None else {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state_dict: StateDict) -> None:
        """Restore the gradient scaler's state."""
        if "scaler" not in state_dict:
            return
        if self.scaler is None:
            rank_zero_warn(
                f"the checkpoint holds a gradient scaler's state, which {self.name} does not "
                "use: it is ignored"
            )
            return
        self.scaler.load_state_dict(state_dict["scaler"])

    @override
    def __repr__(self) -> str:
        return f"MixedPrecision({self.name!r}, device_type={self.device_type!r})"
