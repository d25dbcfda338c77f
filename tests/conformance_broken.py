"""Strategies that each break one clause of the collective contract, on purpose.

The conformance suite must catch every one of them, naming the property broken
(``test_conformance_catches.py``). Each is DDP with one collective changed the
way a real implementation might get it wrong, or (the last three) a mesh strategy
that reads the mesh's dimensions wrongly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, ClassVar, TypeVar, overload

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.core import ReduceOp
from plait.strategies import DDPStrategy, ModelParallelStrategy
from plait.strategies.collectives import DistributedCollectives

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from plait.core import Collectives
    from plait.core.typing import Group, ReduceOpLike

T = TypeVar("T")


class _Flawed(DistributedCollectives):
    """The collectives of a DDP strategy, sharing its group, store and rendezvous."""

    _group: Group | None = None  # of the reduce in progress

    def __init__(self, inner: DistributedCollectives) -> None:
        # A copy of the working collectives' state, not a second group.
        self.__dict__.update(vars(inner))

    @overload
    def reduce(
        self, value: torch.Tensor, group: Group | None = None, reduce_op: ReduceOpLike = "mean"
    ) -> torch.Tensor: ...

    @overload
    def reduce(
        self, value: float, group: Group | None = None, reduce_op: ReduceOpLike = "mean"
    ) -> float: ...

    @override
    def reduce(
        self,
        value: torch.Tensor | float,
        group: Group | None = None,
        reduce_op: ReduceOpLike = "mean",
    ) -> torch.Tensor | float:
        self._group = group
        return self.flawed_reduce(value, self.read_op(reduce_op))

    def read_op(self, reduce_op: ReduceOpLike) -> str:
        """The op's name, read as the contract reads it unless overridden."""
        return str(ReduceOp.parse(reduce_op))

    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        """The reduction as this flaw computes it; correct unless overridden."""
        return super().reduce(value, self._group, reduce_op=op)


class MeanThatSumsCollectives(_Flawed):
    @override
    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        return super().flawed_reduce(value, "sum" if op == "mean" else op)


def _differ(first: torch.Tensor | float, second: torch.Tensor | float) -> bool:
    if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)):
        return bool(first != second) and not (first != first and second != second)  # noqa: PLR0124
    if first.dtype != second.dtype or first.shape != second.shape:
        return True
    wide = torch.complex128 if first.is_complex() else torch.float64
    return not torch.allclose(first.to(wide), second.to(wide), equal_nan=True)


class MeanThatSumsOnceCollectives(_Flawed):
    _slipped = False

    @override
    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        mean = super().flawed_reduce(value, op)
        if op != "mean" or self._slipped:
            return mean
        total = super().flawed_reduce(value, "sum")
        # Every rank sees the same results, so every rank decides alike. Slip only
        # where the sum is visibly wrong (NaN or infinite means read as equal).
        if not _differ(total, mean):
            return mean
        self._slipped = True
        return total


class TruncatingMeanCollectives(_Flawed):
    @override
    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        integral = isinstance(value, torch.Tensor) and not value.is_floating_point()
        if op != "mean" or not integral or value.is_complex():  # type: ignore[union-attr]
            return super().flawed_reduce(value, op)
        total = super().flawed_reduce(value, "sum")
        assert isinstance(total, torch.Tensor)
        return torch.div(total, self.world_size, rounding_mode="trunc").to(self.mean_dtype(total))

    def mean_dtype(self, total: torch.Tensor) -> torch.dtype:
        """The dtype the truncated mean is handed back in: the integers' own."""
        return total.dtype


class MutatingReduceCollectives(_Flawed):
    @override
    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        result = super().flawed_reduce(value, op)
        if not (isinstance(result, torch.Tensor) and isinstance(value, torch.Tensor)):
            return result
        if result.dtype == value.dtype and value.numel():
            value.copy_(result)  # in place, as a raw all_reduce would
            return value
        return result


class IgnoresSrcCollectives(_Flawed):
    @override
    def broadcast(self, obj: T, src: int = 0, group: Group | None = None) -> T:
        return super().broadcast(obj, 0, group)


class ImpatientBarrierCollectives(_Flawed):
    @override
    def barrier(
        self,
        name: str | None = None,
        timeout: timedelta | float | None = None,
        group: Group | None = None,
    ) -> None:
        return


class ReversedGatherCollectives(_Flawed):
    @override
    def all_gather(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        return super().all_gather(tensor, group).flip(0)


class GroupBlindCollectives(_Flawed):
    @override
    def within(self, group: Group | None) -> DistributedCollectives:
        return self  # every collective over the whole job, whatever the group


class DyingGatherCollectives(_Flawed):
    @override
    def all_gather(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        if self.rank == self.world_size - 1:
            os._exit(3)  # a crash: no exception, no clean-up
        return super().all_gather(tensor, group)


class BroadcastReturnsInputCollectives(_Flawed):
    @override
    def broadcast(self, obj: T, src: int = 0, group: Group | None = None) -> T:
        result = super().broadcast(obj, src, group)
        return obj if self.rank == src else result  # src's own tensor, not a copy


class ReduceReturnsInputAloneCollectives(_Flawed):
    @override
    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        if self.world_size == 1 and isinstance(value, torch.Tensor) and op != "mean":
            return value  # nothing to reduce with: the input itself
        return super().flawed_reduce(value, op)


class GatherViewsInputCollectives(_Flawed):
    @override
    def all_gather(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        rows = super().all_gather(tensor, group)
        if rows.shape[0] == 1 and tensor.is_contiguous():
            return tensor.unsqueeze(0)  # one row: a view of the input
        return rows


_SMALL_INTS = (torch.int8, torch.uint8, torch.int16)


class MaxAsSumForSmallIntsCollectives(_Flawed):
    @override
    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        small = isinstance(value, torch.Tensor) and value.dtype in _SMALL_INTS
        return super().flawed_reduce(value, "sum" if op == "max" and small else op)


class _ThroughCollectives(_Flawed):
    """Tensors of ``dtype`` reduced as ``carrier``, and handed back as ``dtype``."""

    dtype: ClassVar[torch.dtype]
    carrier: ClassVar[torch.dtype]

    @override
    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        if isinstance(value, torch.Tensor) and value.dtype == self.dtype and self.carries(op):
            moved = super().flawed_reduce(value.to(self.carrier), op)
            assert isinstance(moved, torch.Tensor)
            return moved.to(self.dtype)
        return super().flawed_reduce(value, op)

    def carries(self, op: str) -> bool:
        """Whether ``op`` goes through the carrier."""
        return True


class Float64ThroughFloat32Collectives(_ThroughCollectives):
    dtype = torch.float64
    carrier = torch.float32


class MeanOverTwoCollectives(_Flawed):
    @override
    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        floating = isinstance(value, torch.Tensor) and value.is_floating_point()
        if op != "mean" or not floating or self.world_size == 1:
            return super().flawed_reduce(value, op)
        total = super().flawed_reduce(value, "sum")
        assert isinstance(total, torch.Tensor)
        return total / 2  # right at two ranks only


class WaitsForRankZeroCollectives(_Flawed):
    _barriers = 0

    @override
    def barrier(
        self,
        name: str | None = None,
        timeout: timedelta | float | None = None,
        group: Group | None = None,
    ) -> None:
        # Rank 0 announces itself and leaves; the others wait for rank 0 only.
        self._barriers += 1
        key = f"broken-barrier/{self._barriers}"
        if self.rank == 0:
            self.store.set(key, "1")
        else:
            self.store.wait([key])


class SpellingSensitiveCollectives(_Flawed):
    @override
    def read_op(self, reduce_op: ReduceOpLike) -> str:
        # Parses ops itself: the lowercase names only; anything else it reads as a sum.
        return reduce_op if isinstance(reduce_op, str) and reduce_op in _NAMES else "sum"


_NAMES = ("sum", "mean", "min", "max", "product")


class SrcAsGroupRankCollectives(_Flawed):
    @override
    def broadcast(self, obj: T, src: int = 0, group: Group | None = None) -> T:
        if group is None:
            return super().broadcast(obj, src, group)
        members = self.within(group).members
        return super().broadcast(obj, members[src], group)  # src read as a place in the group


class TruncatedFloatMeanCollectives(TruncatingMeanCollectives):
    @override
    def mean_dtype(self, total: torch.Tensor) -> torch.dtype:
        return torch.float32  # floating, as the contract says, but divided as integers


class Int64ThroughFloat64Collectives(_ThroughCollectives):
    dtype = torch.int64
    carrier = torch.float64

    @override
    def carries(self, op: str) -> bool:
        return op != "mean"


class BFloat16InFloat16Collectives(_ThroughCollectives):
    dtype = torch.bfloat16
    carrier = torch.float16


class PowerOfTwoSumCollectives(_Flawed):
    @override
    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        # A tree that halves the ranks, written for powers of two: the ranks beyond the
        # largest power of two at or below the world size are never added in.
        kept = 1 << (self.world_size.bit_length() - 1)
        if op not in ("sum", "mean") or not isinstance(value, torch.Tensor) or self.rank < kept:
            return super().flawed_reduce(value, op)
        return super().flawed_reduce(torch.zeros_like(value), op)


class Int64SumOffByOneCollectives(_Flawed):
    @override
    def flawed_reduce(self, value: torch.Tensor | float, op: str) -> torch.Tensor | float:
        result = super().flawed_reduce(value, op)
        if isinstance(result, torch.Tensor) and result.dtype == torch.int64 and op == "sum":
            return result + 1
        return result


class _BrokenDDP(DDPStrategy):
    flaw: ClassVar[type[_Flawed]]

    @override
    def make_collectives(self, distributed: DistributedCollectives) -> Collectives:
        return self.flaw(distributed)


class MeanThatSums(_BrokenDDP):
    """``reduce(x, "mean")`` returns the sum."""

    flaw = MeanThatSumsCollectives


class MeanThatSumsOnce(_BrokenDDP):
    """The first ``reduce(x, "mean")`` that a sum would get wrong returns the sum."""

    flaw = MeanThatSumsOnceCollectives


class TruncatingIntegerMean(_BrokenDDP):
    """The mean of integers is an integer, truncated."""

    flaw = TruncatingMeanCollectives


class MutatingReduce(_BrokenDDP):
    """``reduce`` writes the result into the caller's tensor."""

    flaw = MutatingReduceCollectives


class BroadcastIgnoresSrc(_BrokenDDP):
    """``broadcast`` always sends rank 0's value."""

    flaw = IgnoresSrcCollectives


class ImpatientBarrier(_BrokenDDP):
    """``barrier`` returns at once."""

    flaw = ImpatientBarrierCollectives


class IgnoresGroups(_BrokenDDP):
    """Collectives given a sub-group run over every rank instead."""

    flaw = GroupBlindCollectives


class ReversedAllGather(_BrokenDDP):
    """``all_gather`` stacks the rows last rank first."""

    flaw = ReversedGatherCollectives


class DyingAllGather(_BrokenDDP):
    """The last rank's process exits in the middle of ``all_gather``."""

    flaw = DyingGatherCollectives


class BroadcastReturnsInput(_BrokenDDP):
    """``broadcast`` gives ``src`` back its own tensor, not a copy."""

    flaw = BroadcastReturnsInputCollectives


class ReduceReturnsInputAlone(_BrokenDDP):
    """With one process, ``reduce`` returns the input tensor itself."""

    flaw = ReduceReturnsInputAloneCollectives


class GatherViewsInput(_BrokenDDP):
    """With one process, ``all_gather`` returns a view of the input."""

    flaw = GatherViewsInputCollectives


class MaxAsSumForSmallInts(_BrokenDDP):
    """``reduce(x, "max")`` sums int8, uint8 and int16 tensors."""

    flaw = MaxAsSumForSmallIntsCollectives


class Float64ThroughFloat32(_BrokenDDP):
    """float64 tensors are reduced in float32."""

    flaw = Float64ThroughFloat32Collectives


class MeanOverTwo(_BrokenDDP):
    """The mean of floating tensors divides the sum by two, whatever the world size."""

    flaw = MeanOverTwoCollectives


class WaitsForRankZero(_BrokenDDP):
    """``barrier`` waits for rank 0 only; rank 0 waits for nobody."""

    flaw = WaitsForRankZeroCollectives


class SpellingSensitive(_BrokenDDP):
    """``reduce`` reads any op but the five lowercase names as a sum: ``'MEAN'``, ``'avg'``,
    ``ReduceOp.MEAN`` or ``torch.distributed.ReduceOp.AVG``."""

    flaw = SpellingSensitiveCollectives


class SrcAsGroupRank(_BrokenDDP):
    """``broadcast`` over a sub-group reads ``src`` as a rank within the group."""

    flaw = SrcAsGroupRankCollectives


class TruncatedFloatMean(_BrokenDDP):
    """The mean of integers is floating, but divided as integers first."""

    flaw = TruncatedFloatMeanCollectives


class Int64ThroughFloat64(_BrokenDDP):
    """int64 tensors are reduced as float64 (which holds 53 bits of them)."""

    flaw = Int64ThroughFloat64Collectives


class BFloat16InFloat16(_BrokenDDP):
    """bfloat16 tensors are reduced in float16 (whose range ends at 65504)."""

    flaw = BFloat16InFloat16Collectives


class PowerOfTwoSum(_BrokenDDP):
    """Sums and means leave out the ranks beyond the largest power of two."""

    flaw = PowerOfTwoSumCollectives


class Int64SumOffByOne(_BrokenDDP):
    """The sum of int64 tensors is one too many: every later plain reduce shows it too."""

    flaw = Int64SumOffByOneCollectives


def unchecked_ddp() -> DDPStrategy:
    """DDP with the mismatch check turned off: mismatched calls reach gloo as they are."""
    return DDPStrategy(checked_collectives=False, timeout=timedelta(seconds=20))


Dimensions = Mapping[str, dist.ProcessGroup | None]


def _over_the_world(dimensions: Dimensions) -> dict[str, dist.ProcessGroup | None]:
    return dict.fromkeys(dimensions)  # None: the whole job


def _over_the_other_dimension(dimensions: Dimensions) -> dict[str, dist.ProcessGroup | None]:
    swapped = dict(dimensions)
    swapped["tp"], swapped["dp_shard"] = dimensions["dp_shard"], dimensions["tp"]
    return swapped


class _BrokenMesh(ModelParallelStrategy):
    """`ModelParallelStrategy` whose collectives read the mesh's dimensions wrongly."""

    def __init__(
        self,
        misread: Callable[[Dimensions], dict[str, dist.ProcessGroup | None]],
        mesh_shape: tuple[int, ...],
    ) -> None:
        data, tensor = mesh_shape
        super().__init__(accelerator="cpu", data_parallel_size=data, tensor_parallel_size=tensor)
        self.misread = misread

    @override
    def make_collectives(self, distributed: DistributedCollectives) -> Collectives:
        named = super().make_collectives(distributed)
        assert isinstance(named, DistributedCollectives)
        return named.with_dimensions(self.misread(named.dimensions))


def reduces_over_the_world(mesh_shape: tuple[int, ...]) -> ModelParallelStrategy:
    """A mesh strategy whose collectives given a dimension run over every rank instead."""
    return _BrokenMesh(_over_the_world, mesh_shape)


def reduces_over_the_wrong_dimension(mesh_shape: tuple[int, ...]) -> ModelParallelStrategy:
    """A mesh strategy that takes ``tp`` for ``dp_shard`` and ``dp_shard`` for ``tp``."""
    return _BrokenMesh(_over_the_other_dimension, mesh_shape)


class _MeshOfSwappedGroups(ModelParallelStrategy):
    """`ModelParallelStrategy` whose device mesh holds ``tp``'s groups as ``dp_shard``'s.

    Its collectives run over the strategy's own groups, which are right; what takes
    the mesh's groups (a pipeline's stages, FSDP, tensor parallelism) talks to the
    wrong ranks.
    """

    _swapped: DeviceMesh | None = None

    def __init__(self, mesh_shape: tuple[int, ...]) -> None:
        data, tensor = mesh_shape
        super().__init__(accelerator="cpu", data_parallel_size=data, tensor_parallel_size=tensor)

    @property
    @override
    def device_mesh(self) -> DeviceMesh:
        from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415

        mesh = super().device_mesh
        if self._swapped is None:
            names = mesh.mesh_dim_names
            assert names is not None
            swap = {"dp_shard": "tp", "tp": "dp_shard"}
            self._swapped = DeviceMesh.from_group(
                [mesh.get_group(swap.get(name, name)) for name in names],
                mesh.device_type,
                mesh=mesh.mesh,
                mesh_dim_names=names,
            )
        return self._swapped


def mesh_of_swapped_groups(mesh_shape: tuple[int, ...]) -> ModelParallelStrategy:
    """A mesh strategy whose device mesh gives ``tp``'s group for ``dp_shard`` and back."""
    return _MeshOfSwappedGroups(mesh_shape)
