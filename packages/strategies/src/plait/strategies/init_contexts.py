"""Contexts to build a module in: on the strategy's device, in the precision's dtype."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

from torch.overrides import TorchFunctionMode
from typing_extensions import override

__all__ = ["SkipInitialisation", "precision_context"]


class SkipInitialisation(TorchFunctionMode):
    """Inside, ``torch.nn.init``'s functions leave tensors as they are.

    A module built inside has its parameters allocated and never filled: for one
    whose state is loaded from a checkpoint right after, the filling is wasted time.
    """

    @override
    def __torch_function__(
        self,
        func: Callable[..., object],
        types: Sequence[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
    ) -> object:
        if getattr(func, "__module__", None) == "torch.nn.init":
            # Every torch.nn.init function takes the tensor first and returns it.
            return kwargs["tensor"] if kwargs and "tensor" in kwargs else args[0]
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def precision_context(precision: object, kind: str) -> Iterator[None]:
    """The precision plugin's ``tensor_init_context`` (or ``module_init_context``).

    A plugin without one (one of your own) changes nothing.
    """
    make = getattr(precision, f"{kind}_init_context", None)
    if not callable(make):
        yield
        return
    context = make()
    assert isinstance(context, contextlib.AbstractContextManager)
    with context:
        yield
