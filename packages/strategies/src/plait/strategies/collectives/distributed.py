"""The collective contract over a torch.distributed process group, checked through its store."""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar, overload

import torch
import torch.distributed as dist

from plait.core import CollectiveCall, ConfigurationError, ReduceOp
from plait.strategies.collectives import wire
from plait.strategies.collectives.arguments import as_timeout, check_group_name, check_src
from plait.strategies.collectives.reduction import (
    DTYPES,
    TORCH_OPS,
    combine,
    number_result,
    reduce_dtype,
    reducible,
    result_dtype,
)
from plait.strategies.collectives.reduction import wire as wire_dtype
from plait.strategies.collectives.rendezvous import Rendezvous
from plait.strategies.store import STORE_PREFIX

if TYPE_CHECKING:
    from plait.core.typing import Group, ReduceOpLike

__all__ = ["DistributedCollectives"]

T = TypeVar("T")


class DistributedCollectives:
    """The contract over a torch.distributed process group, checked through its store.

    Args:
        group: The process group the collectives run on.
        store: A store every rank of the group shares, for checks and barriers.
        rank: This process's global rank.
        world_size: The group's size, when it is the whole job.
        device: This process's device, where results land.
        checked: Compare every rank's call before running a collective.
        timeout: How long a rank waits for the others (steady state).
        dimensions: The groups of the layout's dimensions, by name, for ``group=``
            given as a name (``None``: the whole group).
        members: The global ranks of ``group``, in its order, when it is a sub-group.
    """

    def __init__(
        self,
        *,
        group: dist.ProcessGroup,
        store: dist.Store,
        rank: int,
        device: torch.device,
        world_size: int | None = None,
        checked: bool = True,
        timeout: timedelta = timedelta(minutes=30),
        dimensions: Mapping[str, dist.ProcessGroup | None] | None = None,
        members: Sequence[int] | None = None,
    ) -> None:
        self.group = group
        tag = "" if members is None else "group-" + ",".join(map(str, members)) + ":"
        self._rendezvous = Rendezvous(
            store, rank=rank, world_size=world_size, members=members, prefix=STORE_PREFIX, tag=tag
        )
        self._job_store = store
        self.store = self._rendezvous.store
        self.rank = rank
        self.members = self._rendezvous.members
        self.world_size = len(self.members)
        self.device = device
        self.checked = checked
        self.timeout = timeout
        self.dimensions = dict(dimensions or {"data_parallel": None})
        self._subgroups: dict[tuple[int, ...], DistributedCollectives] = {}
        # gloo moves CPU tensors; NCCL moves tensors of this process's GPU.
        backend = dist.get_backend(group)
        self.comm_device = device if backend == "nccl" else torch.device("cpu")

    def depart(self) -> None:
        """Finish with the job's store (see `Rendezvous.depart`); call once, at teardown."""
        self._rendezvous.depart(self.timeout)

    def rendezvous(
        self, call: CollectiveCall, timeout: timedelta, note: bytes = b""
    ) -> list[bytes]:
        """Meet every rank through the store and compare calls (see `Rendezvous.meet`)."""
        return self._rendezvous.meet(call, timeout, note)

    def within(self, group: Group | None) -> DistributedCollectives:
        """The collectives among the ranks of ``group`` (these, for ``None``).

        Raises:
            ConfigurationError: ``group`` is neither a process group nor the name of a
                dimension of the layout.
            ValueError: This rank is not in ``group``.
        """
        if group is None:
            return self
        if isinstance(group, str):
            check_group_name(group, list(self.dimensions))
            named = self.dimensions[group]
            if named is None:
                return self
            group = named
        given: object = group
        if given == dist.GroupMember.NON_GROUP_MEMBER:
            # What torch's new_group gives the ranks it leaves out.
            raise ValueError(
                f"rank {self.rank} called a collective over a group it is not in (new_group "
                "gave it NON_GROUP_MEMBER): only the group's ranks may call it"
            )
        if not isinstance(group, dist.ProcessGroup):
            raise ConfigurationError(
                f"group={group!r} is a {type(group).__name__}, not a process group",
                value=group,
                choices=list(self.dimensions),
                fix="pass a torch.distributed process group, or a dimension's name",
            )
        # The group's global ranks, in its order.
        members = tuple(dist.get_process_group_ranks(group))
        if self.rank not in members:
            raise ValueError(
                f"rank {self.rank} called a collective over a group of the ranks "
                f"{list(members)}, which it is not in: only the group's ranks may call it"
            )
        if members == self.members:
            return self
        found = self._subgroups.get(members)
        if found is None:
            found = DistributedCollectives(
                group=group,
                store=self._job_store,
                rank=self.rank,
                device=self.device,
                checked=self.checked,
                timeout=self.timeout,
                members=members,
            )
            self._subgroups[members] = found
        return found

    def _check(self, collective: str, **params: object) -> None:
        if self.checked and self.world_size > 1:
            self.rendezvous(CollectiveCall(collective, params), self.timeout)

    def _inline(self, work: torch.Tensor) -> bool:
        # Whether every rank's ``work`` can travel in the checking meeting instead of
        # a collective. Every rank decides alike: the meeting compares shape and dtype.
        return (
            self.checked
            and self.world_size > 1
            and self.comm_device.type == "cpu"
            and work.numel() * work.element_size() * self.world_size <= wire.INLINE_ALL_BYTES
        )

    def _exchange(
        self, work: torch.Tensor, collective: str, **params: object
    ) -> list[torch.Tensor]:
        """Every rank's ``work``, by rank, read from the meeting that checks the call."""
        notes = self.rendezvous(
            CollectiveCall(collective, params), self.timeout, wire.tensor_bytes(work)
        )
        return [wire.tensor_from_bytes(note, work.dtype, list(work.shape)) for note in notes]

    # The collectives.

    @overload
    def reduce(
        self, value: torch.Tensor, group: Group | None = None, reduce_op: ReduceOpLike = "mean"
    ) -> torch.Tensor: ...

    @overload
    def reduce(
        self, value: float, group: Group | None = None, reduce_op: ReduceOpLike = "mean"
    ) -> float: ...

    def reduce(
        self,
        value: torch.Tensor | float,
        group: Group | None = None,
        reduce_op: ReduceOpLike = "mean",
    ) -> torch.Tensor | float:
        """Reduce over every rank (of ``group``), out of place; integer means are floating."""
        among = self.within(group)
        reducible(value)
        op = ReduceOp.parse(reduce_op)
        # A Python float is a double: reduced as float32 it would lose digits.
        tensor = (
            value
            if isinstance(value, torch.Tensor)
            else torch.tensor(value, dtype=torch.int64 if isinstance(value, int) else torch.float64)
        )
        call = {
            "op": op.value,
            "kind": "tensor" if isinstance(value, torch.Tensor) else "number",
            "shape": tuple(tensor.shape),
            "dtype": tensor.dtype,
        }
        # A Python number's mean is a Python float, a double.
        dtype = reduce_dtype(tensor, op, None if isinstance(value, torch.Tensor) else torch.float64)
        # Contiguous, so that element i is element i on every rank whatever the
        # caller's strides (a collective runs over the memory as laid out).
        work = tensor.detach().to(
            among.comm_device, dtype, copy=True, memory_format=torch.contiguous_format
        )
        if among._inline(work) and not work.is_complex():
            work = combine(among._exchange(work, "reduce", **call), op)
        else:
            among._check("reduce", **call)
            dist.all_reduce(work, op=TORCH_OPS[op], group=among.group)
        if op is ReduceOp.MEAN:
            work /= among.world_size
        if isinstance(value, torch.Tensor):
            return work.to(value.device, result_dtype(value, op, dtype))
        return number_result(value, op, work)

    def broadcast(self, obj: T, src: int = 0, group: Group | None = None) -> T:
        """Give every rank (of ``group``) a value equal to global rank ``src``'s.

        Tensors travel without pickling. Checked, ``src`` describes the value in the
        meeting that checks the call (dtype and shape of a tensor, or the value
        itself when it is small and the group moves CPU tensors), so that the value
        needs one broadcast at most. Unchecked, a header broadcast describes it first.

        Raises:
            TypeError: ``src``'s object cannot be pickled (raised on every rank).
        """
        among = self.within(group)
        src = check_src(src, among.members)
        if among.world_size == 1:  # as a single process's collectives: nothing moves
            if isinstance(obj, torch.Tensor):
                return wire.own_copy(obj, self.device)  # type: ignore[return-value]
            return obj
        if not among.checked:
            return among._broadcast_with_header(obj, src)
        return among._broadcast_described(obj, src)

    def _broadcast_described(self, obj: T, src: int) -> T:
        note = pickled = b""
        if self.rank == src:
            note, pickled = wire.describe(obj, inline=self.comm_device.type == "cpu")
        notes = self.rendezvous(CollectiveCall("broadcast", {"src": src}), self.timeout, note)
        kind, _, body = notes[self.members.index(src)].partition(b":")
        if kind == wire.UNPICKLABLE:
            message = f"broadcast: src={src}'s object cannot be pickled: {body.decode()}"
            raise TypeError(message)
        if kind == wire.INLINE_OBJECT:
            return obj if self.rank == src else pickle.loads(body)
        if kind == wire.PICKLED:
            return self._broadcast_pickled(obj, src, pickled, int(body))
        dtype_index, shape, *inline = body.split(b":", 2)
        dtype = DTYPES[int(dtype_index)]
        dims = [int(size) for size in shape.split(b",") if size]
        if kind == wire.TENSOR:
            return self._broadcast_tensor(obj, src, dtype, dims)  # type: ignore[return-value]
        if self.rank == src:  # the tensor travelled inline
            assert isinstance(obj, torch.Tensor)
            return wire.own_copy(obj, self.device)  # type: ignore[return-value]
        return wire.tensor_from_bytes(inline[0], dtype, dims).to(self.device)  # type: ignore[return-value]

    def _broadcast_with_header(self, obj: T, src: int) -> T:
        header = torch.zeros(2 + wire.MAX_FAST_DIMS, dtype=torch.int64, device=self.comm_device)
        if self.rank == src and wire.fast(obj):
            assert isinstance(obj, torch.Tensor)
            header[0] = 1 + DTYPES.index(obj.dtype)
            header[1] = obj.dim()
            header[2 : 2 + obj.dim()] = torch.tensor(obj.shape, dtype=torch.int64)
        dist.broadcast(header, src=src, group=self.group)
        kind, ndim = int(header[0]), int(header[1])
        if kind == 0:
            box = [obj if self.rank == src else None]
            dist.broadcast_object_list(box, src=src, group=self.group)
            return box[0]  # type: ignore[return-value]
        dims = header[2 : 2 + ndim].tolist()
        return self._broadcast_tensor(obj, src, DTYPES[kind - 1], dims)  # type: ignore[return-value]

    def _broadcast_tensor(
        self, obj: object, src: int, dtype: torch.dtype, dims: list[int]
    ) -> torch.Tensor:
        if self.rank == src:
            assert isinstance(obj, torch.Tensor)
            buffer = obj.detach().to(self.comm_device, wire_dtype(dtype)).contiguous()
            if buffer.untyped_storage().data_ptr() != obj.untyped_storage().data_ptr():
                dist.broadcast(buffer, src=src, group=self.group)  # a copy already
                return buffer.to(self.device, dtype)
            work = dist.broadcast(buffer, src=src, group=self.group, async_op=True)
            # The buffer is the caller's tensor: src's result is a copy of its own,
            # made while the data travels.
            result = wire.own_copy(obj, self.device)
            work.wait()
            return result
        buffer = torch.empty(dims, dtype=wire_dtype(dtype), device=self.comm_device)
        dist.broadcast(buffer, src=src, group=self.group)
        return buffer.to(self.device, dtype)

    def _broadcast_pickled(self, obj: T, src: int, pickled: bytes, size: int) -> T:
        # src pickled the object once, to measure it; the pickle travels as a tensor.
        if self.rank == src:
            data = bytearray(pickled)
            buffer = torch.frombuffer(data, dtype=torch.uint8).to(self.comm_device)
        else:
            buffer = torch.empty(size, dtype=torch.uint8, device=self.comm_device)
        dist.broadcast(buffer, src=src, group=self.group)
        if self.rank == src:
            return obj
        return pickle.loads(wire.tensor_bytes(buffer.cpu()))  # type: ignore[no-any-return]

    def barrier(
        self,
        name: str | None = None,
        timeout: timedelta | float | None = None,
        group: Group | None = None,
    ) -> None:
        """Wait until every rank (of ``group``) has entered; name the missing on timeout.

        Raises:
            CollectiveTimeoutError: ``timeout`` passed before every rank arrived.
            CollectiveMismatchError: Ranks entered barriers of different names, or
                other collectives (in checked mode).
        """
        among = self.within(group)
        among.rendezvous(
            CollectiveCall("barrier", {"name": name}), as_timeout(timeout, self.timeout)
        )

    def all_gather(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        """Stack every rank's ``tensor`` (of ``group``): rows in the group's rank order."""
        among = self.within(group)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_gather takes a tensor, got {type(tensor).__name__}")
        call = {"shape": tuple(tensor.shape), "dtype": tensor.dtype}
        work = tensor.detach().to(among.comm_device, wire_dtype(tensor.dtype)).contiguous()
        if among._inline(work):
            rows = among._exchange(work, "all_gather", **call)
        else:
            among._check("all_gather", **call)
            rows = [torch.empty_like(work) for _ in range(among.world_size)]
            dist.all_gather(rows, work, group=among.group)
        return torch.stack(rows).to(tensor.device, tensor.dtype)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002
        """Whether ``decision`` holds on every rank (``all``) or on any rank."""
        if self.checked and self.world_size > 1:  # the votes travel in the meeting
            call = CollectiveCall("reduce_boolean_decision", {"all": all})
            notes = self.rendezvous(call, self.timeout, b"1" if decision else b"0")
            count = notes.count(b"1")
            return count == self.world_size if all else count > 0
        votes = torch.tensor(int(bool(decision)), device=self.comm_device)
        dist.all_reduce(votes, op=dist.ReduceOp.SUM, group=self.group)
        count = int(votes.item())
        return count == self.world_size if all else count > 0
