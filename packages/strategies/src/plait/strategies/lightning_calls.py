"""What Lightning's and Fabric's code calls on a strategy, by their names.

`plait.strategies.base.BaseStrategy` is built on `LightningCalls`: the parts assigned
after the strategy is made (``strategy.accelerator = ...``, ``precision_plugin``),
Fabric's one-call set-up (`LightningCalls.setup`, `LightningCalls.setup_optimizer`), the
contexts to make tensors and modules in, a module state's load, and the gradient
clipping calls by norm and by value. Each is written on what every strategy has
(`StrategyHost`); `plait.strategies.base` holds plait's own design.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import torch

from plait.core import ConfigurationError, Precision, Strategy
from plait.strategies.init_contexts import SkipInitialisation, precision_context
from plait.strategies.state import check_state_fits

__all__ = ["LightningCalls", "StrategyHost"]


class StrategyHost(Strategy, Protocol):
    """What `LightningCalls` reads of the strategy it is part of: a `Strategy` and more.

    `BaseStrategy` has it all.
    """

    @property
    def is_set_up(self) -> bool:
        """Whether a module (or the process group) has been set up."""
        ...

    @property
    def shards_module(self) -> bool:
        """Whether each rank holds a share of the module's parameters."""
        ...

    @property
    def shards_at_creation(self) -> bool:
        """Whether the module is sharded as it is made (`model_sharded_context`)."""
        ...

    @property
    def loads_as_torch(self) -> bool:
        """Whether a module's state loads through its own ``load_state_dict``."""
        ...

    def assign_part(self, name: str, value: object) -> None:
        """Give the strategy another part (`LightningCalls.assign_part`)."""
        ...

    def tensor_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[None]:
        """The context to make tensors in (`LightningCalls.tensor_init_context`)."""
        ...

    def remake_in_place(self, **changes: object) -> None:
        """Make the strategy anew with ``changes``."""
        ...

    def model_sharded_context(self) -> AbstractContextManager[None]:
        """The context to create the model in."""
        ...

    def module_state_fitted(
        self, module: torch.nn.Module, state_dict: Mapping[str, object]
    ) -> dict[str, object]:
        """The module's whole state with ``state_dict``'s keys put over it."""
        ...


class LightningCalls:
    """A strategy's calls under Lightning's and Fabric's names, on `StrategyHost`."""

    @property
    def precision_plugin(self: StrategyHost) -> Precision:
        """The precision, under its other name (assignable, `assign_part`)."""
        return self.precision

    @precision_plugin.setter
    def precision_plugin(self: StrategyHost, precision: Precision | str) -> None:
        self.assign_part("precision", precision)

    def assign_part(self: StrategyHost, name: str, value: object) -> None:
        """Give the strategy another part, as ``strategy.accelerator = ...`` does in Lightning.

        The strategy is made anew with it (`remake_in_place`): every check its
        constructor makes runs again (an accelerator that does not fit the
        devices, a precision the strategy refuses), and ranks launched later are
        made with the part too.

        Raises:
            ConfigurationError: The strategy is set up already (its module, or its
                process group, was made with the old part), or refuses the part.
        """
        if self.is_set_up:
            raise ConfigurationError(
                f"{type(self).__name__}.{name} cannot change once the strategy is set up: its "
                f"module or process group was made with {getattr(self, name)!r}",
                value=value,
                fix=f"assign it before setup (or before the Trainer runs), or make the "
                f"strategy with it: strategy.replace({name}=...)",
            )
        self.remake_in_place(**{name: value})

    def setup_optimizer(
        self: StrategyHost, optimizer: torch.optim.Optimizer
    ) -> torch.optim.Optimizer:
        """`setup_optimizers` for one optimizer (Fabric's call)."""
        return self.setup_optimizers([optimizer])[0]

    def setup(
        self: StrategyHost,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer] = (),
    ) -> tuple[torch.nn.Module, list[torch.optim.Optimizer]]:
        """Everything in one call: `setup_environment`, then `setup_module_and_optimizers`."""
        self.setup_environment()
        return self.setup_module_and_optimizers(module, optimizers)

    @contextlib.contextmanager
    def tensor_init_context(self: StrategyHost, empty_init: bool | None = None) -> Iterator[None]:
        """Tensors made inside are on the strategy's device, in the precision's dtype.

        As Lightning's: with ``precision="bf16-true"``, ``torch.ones(2)`` inside is a
        bfloat16 tensor on `root_device`; the default dtype and device are restored
        after. ``empty_init=True`` leaves out the ``torch.nn.init`` functions torch's
        layers run (``kaiming_uniform_``, ``uniform_``, ``normal_``...), for a module
        whose state is loaded right after.
        """
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.device(self.root_device))
            stack.enter_context(precision_context(self.precision, "tensor"))
            if empty_init:
                stack.enter_context(SkipInitialisation())
            yield

    @contextlib.contextmanager
    def module_init_context(self: StrategyHost, empty_init: bool | None = None) -> Iterator[None]:
        """The context to build the module in.

        `tensor_init_context`; where the strategy shards the module at creation, its
        `model_sharded_context` with the precision's dtype instead.
        """
        if not self.shards_at_creation:
            with self.tensor_init_context(empty_init):
                yield
            return
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.model_sharded_context())
            stack.enter_context(precision_context(self.precision, "module"))
            if empty_init:
                stack.enter_context(SkipInitialisation())
            yield

    def load_module_state_dict(
        self: StrategyHost,
        module: torch.nn.Module,
        state_dict: Mapping[str, object],
        strict: bool = True,
    ) -> None:
        """Load a module's state (as ``module.state_dict()`` gives it) into ``module``.

        ``module`` is the one `setup_module` returned (or the user's, before); the
        state is the user module's, without wrapper prefixes, whole: a sharding
        strategy takes each rank's share. Every rank calls it.

        Args:
            module: The module to load into, in place.
            state_dict: The state, by the user module's names.
            strict: Refuse a key the module lacks or one it has that the state lacks
                (naming them); with ``False`` the state's keys the module has are
                loaded and the rest of the module is left as it was. Where the
                strategy holds the module whole and loads it as PyTorch does, the
                module's own ``load_state_dict`` is called with the state as given
                and ``strict=False``, as Lightning calls it.

        Raises:
            CheckpointError: ``strict`` and the keys differ (each is named), or a
                tensor's shape differs.
        """
        source = "the state dict given"
        if not strict and self.loads_as_torch:
            # The module's own load_state_dict, told strict=False with the state as given,
            # as Lightning calls it (a module that renames old keys in its override sees
            # them); shapes checked first, for the message.
            inner = self.unwrap_module(module)
            own = inner.state_dict()
            common = {key: value for key, value in state_dict.items() if key in own}
            check_state_fits({key: own[key] for key in common}, common, source)
            inner.load_state_dict(state_dict, strict=False)
            return
        state = self.module_state_fitted(module, state_dict) if not strict else dict(state_dict)
        self.set_state_dict(module, (), {"state_dict": state}, source=source)

    def clip_gradients_norm(
        self: StrategyHost,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> torch.Tensor:
        """Scale ``optimizer``'s gradients down to a total norm of ``max_norm``: Fabric's call.

        `clip_gradients` by norm, on every strategy alike (the norm of sharded
        gradients and of every pipeline stage's is the whole model's).

        Returns:
            The gradients' total norm before clipping, a tensor holding one number
            (the same on every rank).

        Raises:
            ConfigurationError: ``max_norm`` is not a positive number, ``norm_type``
                is not 2 (plait clips by the Euclidean norm, the one it sums over
                shards and stages), or the strategy clips inside its optimizer step
                (DeepSpeed) and has no norm to give before it.
            RuntimeError: ``error_if_nonfinite`` and the norm is inf or nan (the
                gradients are then as clipping left them).
        """
        given: object = max_norm
        if isinstance(given, bool) or not isinstance(given, int | float) or not given > 0:
            raise ConfigurationError(
                f"max_norm={max_norm!r} must be a number above 0",
                value=max_norm,
                fix="pass e.g. max_norm=1.0; not to clip, leave the call out",
            )
        if norm_type != 2:
            raise ConfigurationError(
                f"norm_type={norm_type!r}: plait clips by the Euclidean norm (2), the one it "
                "sums over shards and pipeline stages",
                value=norm_type,
                choices=["2.0"],
                fix="pass norm_type=2.0, or clip each value with clip_gradients_value",
            )
        norm = self.clip_gradients(module, optimizer, max_norm, "norm")
        if norm is None:
            raise ConfigurationError(
                f"{type(self).__name__} clips the gradients inside its optimizer step and has "
                "no norm to give back before it; the bound is set for that step",
                value=type(self).__name__,
                fix="call strategy.clip_gradients(model, optimizer, max_norm) instead",
            )
        full_tensor = getattr(norm, "full_tensor", None)  # a DTensor's: the whole norm
        total = full_tensor() if callable(full_tensor) else norm
        assert isinstance(total, torch.Tensor)
        if error_if_nonfinite and not bool(torch.isfinite(total)):
            raise RuntimeError(
                f"the gradients' total norm is {total.item()}: they hold inf or nan and cannot "
                "be clipped (pass error_if_nonfinite=False to go on, as a gradient scaler does)"
            )
        return total

    def clip_gradients_value(
        self: StrategyHost,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
    ) -> None:
        """Clamp each of ``optimizer``'s gradients to ``[-clip_val, clip_val]``: Fabric's call.

        `clip_gradients` by value (unscaled first).
        """
        self.clip_gradients(module, optimizer, clip_val, "value")
