"""The collective contract over a torch.distributed process group, checked on every call.

Ranks agree on each call either through the job's store (`Rendezvous`: fast at a few
ranks, where small values ride in the meeting) or through the process group itself
(`Agreement`: one all-reduce of a fingerprint, no store work unless something goes
wrong). Every rank takes the same path: it depends on the group's size alone.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Final, TypeVar, overload

import torch
import torch.distributed as dist

from plait.core import (
    CollectiveCall,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ConfigurationError,
    ReduceOp,
)
from plait.strategies.collectives import wire
from plait.strategies.collectives.agreement import Agreement
from plait.strategies.collectives.arguments import as_timeout, check_group_name, check_src
from plait.strategies.collectives.recorder import FlightRecorder
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

__all__ = [
    "AGREEMENTS",
    "AGREEMENT_VARIABLE",
    "STORE_CROSSOVER",
    "DistributedCollectives",
    "agreement_path",
]

T = TypeVar("T")

AGREEMENTS: Final = ("auto", "store", "backend")
"""How ranks agree on each checked call: by size (``"auto"``), or always one way."""

STORE_CROSSOVER: Final = 16
"""Groups of up to this many ranks agree through the store under ``"auto"``; larger
ones through the process group. Measured by ``tools/bench --sections scale``: at 2
to 16 gloo ranks on one machine the store meeting (which carries small values
itself, and needs each process scheduled once) is the faster; the store's work per
collective grows with the square of the ranks (tens of milliseconds at 64, seconds
at 1024), the process group's path sends it nothing."""


AGREEMENT_VARIABLE: Final = "PLAIT_CHECK_AGREEMENT"
"""The environment variable a strategy reads `AGREEMENTS` from (``"auto"`` if unset);
set it alike for every rank of the job."""

# A broadcast's header, as it rides in the agreement: what kind of value follows.
_TENSOR: Final = 1
_PICKLED: Final = 2
_UNPICKLABLE: Final = 3


def agreement_path(agreement: str, world_size: int) -> str:
    """``"store"`` or ``"backend"``: how a group of ``world_size`` ranks agrees.

    Raises:
        ConfigurationError: ``agreement`` is not one of `AGREEMENTS`.
    """
    if agreement not in AGREEMENTS:
        raise ConfigurationError.invalid_choice("agreement", agreement, AGREEMENTS)
    if agreement == "auto":
        return "store" if world_size <= STORE_CROSSOVER else "backend"
    return agreement


def _moves_cpu_tensors(group: dist.ProcessGroup) -> bool:
    return "gloo" in str(dist.get_backend(group))


class DistributedCollectives:
    """The contract over a torch.distributed process group, every call checked.

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
        agreement: How ranks agree on each checked call (one of `AGREEMENTS`):
            through the job's store up to `STORE_CROSSOVER` ranks, through the
            process group beyond (``"auto"``), or always one way. The process-group
            path needs a group that moves CPU tensors: ``group`` when it is gloo,
            else ``agreement_group``; without one, the store serves.
        agreement_group: A gloo group of the same ranks, for a ``group`` of another
            backend (NCCL).
        recorder: Where every call is written down (shared with sub-groups).

    Attributes:
        group: The process group.
        members: Its global ranks, in its order.
        world_size: How many ranks it has.
        rank: This process's global rank.
        device: This process's device: where results land.
        comm_device: Where tensors are staged for the wire: the process's GPU on
            NCCL, which moves only tensors of its own GPU; the CPU on gloo, which
            moves CUDA tensors too but through host memory. Collectives of your own
            (`make_collectives`) move ``tensor.to(comm_device)`` and hand back
            ``result.to(device)``, so that one implementation serves both backends.
        store: The store the checks and barriers meet in.

    Raises:
        ConfigurationError: ``agreement`` is not one of `AGREEMENTS`.
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
        agreement: str = "auto",
        agreement_group: dist.ProcessGroup | None = None,
        recorder: FlightRecorder | None = None,
    ) -> None:
        self.group = group
        tag = "" if members is None else "group-" + ",".join(map(str, members)) + ":"
        self._rendezvous = Rendezvous(
            store, rank=rank, world_size=world_size, members=members, prefix=STORE_PREFIX, tag=tag
        )
        self.flight_recorder = recorder or FlightRecorder()
        self.agreement = agreement
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
        # gloo (and MPI) move CPU tensors; NCCL, XCCL and the accelerators' own
        # backends move tensors of this process's device.
        backend = str(dist.get_backend(group))
        on_host = backend in ("gloo", "mpi") or device.type == "cpu"
        self.comm_device = torch.device("cpu") if on_host else device
        self._agreement: Agreement | None = None
        on = group if _moves_cpu_tensors(group) else agreement_group
        if on is not None and agreement_path(agreement, self.world_size) == "backend":
            self._agreement = Agreement(
                group=on,
                store=self.store,
                aborts=dist.PrefixStore(STORE_PREFIX, store),
                explain=Rendezvous(
                    store,
                    rank=rank,
                    members=self.members,
                    prefix=STORE_PREFIX,
                    tag=f"explain:{tag}",
                ),
                rank=rank,
                members=self.members,
                tag=tag,
                recorder=self.flight_recorder,
            )

    @property
    def path(self) -> str:
        """How the ranks agree on each checked call: ``"store"`` or ``"backend"``."""
        return "store" if self._agreement is None else "backend"

    def depart(self) -> None:
        """Finish with the job's store (see `Rendezvous.depart`); call once, at teardown."""
        self._rendezvous.depart(self.timeout)

    def rendezvous(
        self, call: CollectiveCall, timeout: timedelta, note: bytes = b""
    ) -> list[bytes]:
        """Meet every rank through the store and compare calls (see `Rendezvous.meet`)."""
        number = self._rendezvous.sequence + 1  # the meeting's own number
        record = self.flight_recorder.start(number, self.members, call, "store")
        try:
            notes = self._rendezvous.meet(call, timeout, note)
        except BaseException as error:
            record.end(_ended(error))
            if isinstance(error, CollectiveTimeoutError):
                error.add_note(self.flight_recorder.note(self.rank))
            raise
        record.end("done")
        return notes

    def agree(
        self, call: CollectiveCall, timeout: timedelta, slots: Sequence[int] = ()
    ) -> list[int]:
        """Every rank's agreement on ``call``, on this group's path.

        Through the process group (see `Agreement.agree`), the combined ``slots``
        come back; through the store, nothing rides along (an empty list).
        """
        if self._agreement is not None:
            return self._agreement.agree(call, timeout, slots)
        self.rendezvous(call, timeout)
        return []

    def with_dimensions(
        self, dimensions: Mapping[str, dist.ProcessGroup | None]
    ) -> DistributedCollectives:
        """These collectives, with ``group=NAME`` naming ``dimensions``' groups.

        The same calls over the same ranks (the job's store, agreement and flight
        recorder are shared); only the names a collective's ``group`` may take
        change: a mesh's dimensions (``"dp"``, ``"tp"``, ...), each the group of this
        rank along it (``None``: the whole job).
        """
        named = copy.copy(self)
        named.dimensions = dict(dimensions)
        return named

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
                agreement=self.agreement,
                recorder=self.flight_recorder,
            )
            self._subgroups[members] = found
        return found

    def check(self, collective: str, /, group: Group | None = None, **params: object) -> None:
        """Compare this call with every rank's (of ``group``) before a collective of your own.

        For collectives written on top of these (see
        `ParallelStrategy.make_collectives`): call it on every rank, with the
        collective's name and each parameter every rank must agree on, before your
        collective runs. Values are compared as text. plait's own collectives pass:

        - ``reduce``: ``op``, ``kind`` (``"tensor"`` or ``"number"``), ``shape``, ``dtype``;
        - ``all_gather``: ``shape``, ``dtype``;
        - ``broadcast``: ``src``;
        - ``barrier``: ``name``.

        Unchecked (``checked=False``) or on one rank, it does nothing.

        Raises:
            CollectiveMismatchError: A rank made a different call (every rank raises,
                naming each rank's call).
            CollectiveTimeoutError: A rank did not call within the timeout (named).
            ValueError: This rank is not in ``group``.
        """
        self.within(group)._check(collective, **params)

    def _check(self, collective: str, **params: object) -> None:
        if self.checked and self.world_size > 1:
            self.agree(CollectiveCall(collective, params), self.timeout)

    def _inline(self, work: torch.Tensor) -> bool:
        # Whether every rank's ``work`` can travel in the checking meeting instead of
        # a collective. Every rank decides alike: the meeting compares shape and dtype.
        return (
            self.checked
            and self._agreement is None
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
        if among._agreement is not None:
            return among._broadcast_agreed(obj, src)
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

    def _broadcast_agreed(self, obj: T, src: int) -> T:
        # The header rides in the agreement: src gives it, the others zeros.
        assert self._agreement is not None
        header: list[int] = []
        pickled = b""
        unpicklable = f"unpicklable/{src}"
        if self.rank == src:
            if wire.fast(obj):
                assert isinstance(obj, torch.Tensor)
                header = [_TENSOR, DTYPES.index(obj.dtype), obj.dim(), *obj.shape]
            else:
                try:
                    pickled = pickle.dumps(obj)
                    header = [_PICKLED, len(pickled)]
                except Exception as error:  # noqa: BLE001 - reported to every rank
                    self.store.set(unpicklable, f"{type(error).__name__}: {error}")
                    header = [_UNPICKLABLE]
        call = CollectiveCall("broadcast", {"src": src})
        kind, first, ndim, *dims = self._agreement.agree(call, self.timeout, header)
        if kind == _UNPICKLABLE:
            why = self.store.get(unpicklable).decode()
            raise TypeError(f"broadcast: src={src}'s object cannot be pickled: {why}")
        if kind == _PICKLED:
            return self._broadcast_pickled(obj, src, pickled, first)
        return self._broadcast_tensor(obj, src, DTYPES[first], dims[:ndim])  # type: ignore[return-value]

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
        among.agree(CollectiveCall("barrier", {"name": name}), as_timeout(timeout, self.timeout))

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
        if self.checked and self.world_size > 1 and self._agreement is not None:
            # One slot: the largest "no" (for all) or "yes" (for any) of any rank.
            call = CollectiveCall("reduce_boolean_decision", {"all": all})
            vote = int(bool(decision))
            slot = self._agreement.agree(call, self.timeout, [1 - vote if all else vote])[0]
            return slot == 0 if all else slot == 1
        if self.checked and self.world_size > 1:  # the votes travel in the meeting
            call = CollectiveCall("reduce_boolean_decision", {"all": all})
            notes = self.rendezvous(call, self.timeout, b"1" if decision else b"0")
            count = notes.count(b"1")
            return count == self.world_size if all else count > 0
        votes = torch.tensor(int(bool(decision)), device=self.comm_device)
        dist.all_reduce(votes, op=dist.ReduceOp.SUM, group=self.group)
        count = int(votes.item())
        return count == self.world_size if all else count > 0


def _ended(error: BaseException) -> str:
    if isinstance(error, CollectiveMismatchError):
        return "mismatch"
    if isinstance(error, CollectiveTimeoutError):
        return "timed out"
    return "failed"
