"""The reduction operations of the collective contract, named plainly."""

from __future__ import annotations

import enum
import sys
from typing import Final

from typing_extensions import override

from plait.core.errors import ConfigurationError

__all__ = ["ReduceOp"]


class ReduceOp(enum.Enum):
    """A reduction across ranks: ``sum``, ``mean`` (alias ``avg``), ``min``, ``max``, ``product``.

    Strings are parsed case-insensitively with `parse`, which also accepts the
    matching members of `torch.distributed.ReduceOp`.

    Example:
        >>> ReduceOp.parse("AVG")
        <ReduceOp.MEAN: 'mean'>
    """

    SUM = "sum"
    MEAN = "mean"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"

    @override
    def __str__(self) -> str:
        return self.value

    @classmethod
    def choices(cls) -> tuple[str, ...]:
        """Every accepted spelling: the names, then the aliases."""
        return (*(op.value for op in cls), *_ALIASES)

    @classmethod
    def parse(cls, value: object) -> ReduceOp:
        """Turn what a user wrote into a `ReduceOp`.

        Args:
            value: A `ReduceOp`; a string, in any case, with surrounding
                whitespace ignored; or one of ``SUM``, ``AVG``, ``PRODUCT``, ``MIN``,
                ``MAX`` of `torch.distributed.ReduceOp`.

        Raises:
            ConfigurationError: ``value`` names no reduction; the message lists the
                valid choices and the closest one.
        """
        if isinstance(value, ReduceOp):
            return value
        if isinstance(value, str):
            key = value.strip().lower()
            op = _BY_SPELLING.get(key)
            if op is not None:
                return op
            raise ConfigurationError.invalid_choice("reduce_op", value, cls.choices())
        torch_op = _from_torch(value)
        if torch_op is not None:
            return torch_op
        raise ConfigurationError(
            f"invalid reduce_op: {value!r} of type {type(value).__name__}",
            value=value,
            choices=cls.choices(),
            fix="pass the name of the reduction as a string, e.g. reduce_op='sum'",
        )


_ALIASES: Final[dict[str, ReduceOp]] = {"avg": ReduceOp.MEAN}
_BY_SPELLING: Final[dict[str, ReduceOp]] = {op.value: op for op in ReduceOp} | _ALIASES


def _from_torch(value: object) -> ReduceOp | None:
    # torch.distributed is looked up, never imported: if it is not imported yet, the
    # value cannot be one of its ops, and plait.core stays free of torch at import.
    # Builds of torch without distributed support have no ReduceOp at all.
    torch_reduce_op = getattr(sys.modules.get("torch.distributed"), "ReduceOp", None)
    if torch_reduce_op is None or not isinstance(
        value, torch_reduce_op | torch_reduce_op.RedOpType
    ):
        return None
    torch_ops = {
        torch_reduce_op.SUM: ReduceOp.SUM,
        torch_reduce_op.AVG: ReduceOp.MEAN,
        torch_reduce_op.PRODUCT: ReduceOp.PRODUCT,
        torch_reduce_op.MIN: ReduceOp.MIN,
        torch_reduce_op.MAX: ReduceOp.MAX,
    }
    for torch_op, op in torch_ops.items():
        if value == torch_op:
            return op
    raise ConfigurationError.invalid_choice(
        "reduce_op",
        value,
        ReduceOp.choices(),
        fix="bitwise and pre-multiplied reductions are not part of the collective "
        "contract; reduce with one of the choices",
    )
