"""Comparisons a rank makes itself: states restored exactly, runs resumed within tolerance."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

import torch
import torch.distributed.tensor

__all__ = [
    "LOOSE",
    "OTHER_ORDER",
    "TOLERANCES",
    "close_states",
    "compare_vectors",
    "copied",
    "differences",
    "first_difference",
    "loss_apart",
    "own_state",
    "tolerance",
]


def own_state(optimizer: torch.optim.Optimizer) -> object:
    """What ``optimizer`` itself holds, or None where it cannot say alone.

    A `ZeroRedundancyOptimizer` must gather its shards first, and an optimizer whose
    parameters a library replaced (DeepSpeed's ZeRO-3 partitions, XLA's device
    copies) may hold state under parameters its groups no longer name: what the
    strategy's `get_state_dict` says of it is compared instead.
    """
    try:
        return copied(optimizer.state_dict())
    except (RuntimeError, KeyError):
        return None


def copied(value: object) -> object:
    """``value`` with every tensor in it copied to the CPU (a DTensor's local shard)."""
    if isinstance(value, torch.distributed.tensor.DTensor):
        return value.to_local().detach().clone().cpu()
    if isinstance(value, torch.Tensor):
        return value.detach().clone().cpu()
    if isinstance(value, Mapping):
        return {key: copied(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(copied(item) for item in value)
    return value


def differences(expected: object, found: object, where: str = "") -> list[str]:
    """Where ``found`` differs from ``expected``: values, dtypes, key types, containers."""
    if isinstance(expected, torch.Tensor):
        return _tensor_differences(expected, found, where)
    if isinstance(expected, Mapping):
        return _mapping_differences(expected, found, where)
    if isinstance(expected, list | tuple):
        if not isinstance(found, list | tuple) or len(found) != len(expected):
            return [f"{where or 'the value'}: {_short(expected)} became {_short(found)}"]
        return [
            problem
            for index, (item, other) in enumerate(zip(expected, found, strict=True))
            for problem in differences(item, other, f"{where}[{index}]")
        ]
    if type(expected) is not type(found) or expected != found:
        return [f"{where or 'the value'}: {_short(expected)} became {_short(found)}"]
    return []


def _tensor_differences(expected: torch.Tensor, found: object, where: str) -> list[str]:
    if not isinstance(found, torch.Tensor):
        return [f"{where or 'the value'}: a tensor became a {type(found).__name__}"]
    if expected.dtype != found.dtype or expected.shape != found.shape:
        return [
            (
                f"{where}: {expected.dtype} of shape {tuple(expected.shape)} became "
                f"{found.dtype} of shape {tuple(found.shape)}"
            )
        ]
    if not torch.equal(expected.cpu(), found.cpu()):
        return [f"{where}: the values differ ({first_difference(expected, found)})"]
    return []


def _mapping_differences(expected: Mapping[object, object], found: object, where: str) -> list[str]:
    if not isinstance(found, Mapping):
        return [f"{where or 'the value'}: a mapping became a {type(found).__name__}"]
    problems = []
    missing = [key for key in expected if key not in found]
    extra = [key for key in found if key not in expected]
    if missing:
        strings = [key for key in missing if str(key) in found]
        if strings:
            problems.append(f"{where or 'the state'}: the keys {strings!r} came back as strings")
        else:
            problems.append(f"{where or 'the state'}: the keys {missing!r} are missing")
    elif extra:
        problems.append(f"{where or 'the state'}: the keys {extra!r} appeared")
    for key in expected:
        if key in found:
            problems += differences(expected[key], found[key], f"{where}[{key!r}]")
    return problems


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def first_difference(expected: torch.Tensor, found: torch.Tensor) -> str:
    """Where two tensors of one shape first differ, and how, for a message."""
    wide = expected.detach().double().cpu().reshape(-1)
    other = found.detach().double().cpu().reshape(-1)
    index = int((wide != other).nonzero()[0])
    return f"at flat index {index}: {wide[index].item()!r} became {other[index].item()!r}"


TOLERANCES: Final = {"32-true": (1e-4, 1e-5), "64-true": (1e-9, 1e-10)}
"""Per precision, the relative and absolute tolerance of values that may round apart."""


LOOSE: Final = (5e-2, 5e-2)
"""The tolerance of a precision of 16 bits (``bf16-mixed``, ``16-mixed``, ...)."""


def tolerance(precision: str, optimizer: str = "sgd") -> tuple[float, float]:
    """The relative and absolute tolerance of ``precision`` (LBFGS: ten times it).

    LBFGS's two-loop recursion divides by differences of gradients, which magnifies
    the rounding of a sum taken in another order.
    """
    rtol, atol = TOLERANCES.get(precision, LOOSE)
    return (rtol * 10, atol * 10) if optimizer == "lbfgs" else (rtol, atol)


OTHER_ORDER: Final = 10.0
"""How many times the precision's relative tolerance a loss may be from one computed
elsewhere (the reference in one process, another strategy), whose sums were taken
in another order; a run against itself (resumed, against never stopped) takes one."""


def loss_apart(
    expected: Sequence[float],
    found: Sequence[float],
    close: tuple[float, float] | None,
    *,
    margin: float = 1.0,
    rounding: Callable[[int], float] = lambda _step: 0.0,
) -> int | None:
    """The first step whose loss in ``found`` does not agree with ``expected``'s; None if all do.

    The one rule for losses: bit for bit where ``close`` is None; else within
    ``margin`` times the relative tolerance (``close[0]``) of ``max(1, |expected|)``,
    plus three times the rounding the example carries at that step
    (`plait.conformance.training.Reference.rounding`). Both have the same length.
    """
    for step, (want, got) in enumerate(zip(expected, found, strict=True)):
        if close is None:
            agree = got == want
        else:
            bound = close[0] * max(1.0, abs(want)) * margin + 3 * rounding(step)
            agree = abs(got - want) <= bound
        if not agree:
            return step
    return None


def compare_vectors(
    expected: Sequence[float], found: Sequence[float], what: str, close: tuple[float, float] | None
) -> list[str]:
    """How ``found`` differs from ``expected``, flattened parameters (None: bit for bit)."""
    want = torch.tensor(expected, dtype=torch.float64)
    got = torch.tensor(found, dtype=torch.float64)
    if want.shape != got.shape:
        return [f"{what} has {got.numel()} parameters, not {want.numel()}"]
    if close is None:
        same = torch.equal(want, got)
    else:
        same = torch.allclose(want, got, rtol=close[0], atol=close[1])
    if same:
        return []
    return [f"{what} differs from the run never stopped ({first_difference(want, got)})"]


def close_states(
    expected: Mapping[str, torch.Tensor],
    found: Mapping[str, torch.Tensor],
    *,
    close: tuple[float, float] | None,
) -> list[str]:
    """How two module states differ, each tensor within ``close`` (None: bit for bit)."""
    if close is None:
        return differences(dict(expected), dict(found))
    problems = []
    for name, value in expected.items():
        other = found.get(name)
        if other is None or other.shape != value.shape:
            problems.append(f"[{name!r}]: missing or of another shape")
        elif not torch.allclose(value.double(), other.double(), rtol=close[0], atol=close[1]):
            problems.append(f"[{name!r}]: {first_difference(value, other)}")
    return problems
