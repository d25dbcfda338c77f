"""The collective contract of `plait.core`, for one process and over torch.distributed.

Checked mode: before a control collective, every rank writes what it is about to
call (a `CollectiveCall`) to the job's store under a sequence number, waits for
every rank's entry, and compares. Ranks that disagree all raise
`CollectiveMismatchError`; ranks that never come make the others raise
`CollectiveTimeoutError` naming them. Nothing hangs on a mismatch.
"""

from __future__ import annotations

import ctypes
import json
import pickle
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Final, TypeVar, overload

import torch
import torch.distributed as dist

from plait.core import (
    CollectiveCall,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    PeerFailedError,
    ReduceOp,
)

if TYPE_CHECKING:
    from plait.core.typing import ReduceOpLike

__all__ = [
    "ABORT_KEY",
    "CURRENT_RUN_KEY",
    "START_PREFIX",
    "STORE_PREFIX",
    "DistributedCollectives",
    "LocalCollectives",
    "Rendezvous",
    "as_timeout",
    "encode_failure",
    "post_failure",
    "run_prefix",
]

STORE_PREFIX: Final = "plait/collectives"
"""Where the collectives keep their keys in the job's store."""

START_PREFIX: Final = "plait/start"
"""Where the ranks meet at start-up, before the process group exists."""

ABORT_KEY: Final = "abort"
"""Set by a launcher when a rank failed: every rank waiting in a check raises."""

_AT: Final = "at/"  # a rank's latest meeting, under each rendezvous prefix
_ABORTED: Final = '["aborted", []]'  # what fills a dead rank's entry
_NOTE: Final = b"\n"  # between a rank's posted call and its note
_LEFT: Final = "left/"  # a rank that has finished with the store

CURRENT_RUN_KEY: Final = "plait/current-run"
"""Where rank 0 posts the number of the run in progress (the job's store is reused)."""


def run_prefix(run: int) -> str:
    """The prefix of run number ``run``'s keys in the job's store."""
    return f"plait/run-{run}/"


_DEPARTURE_SLICE: Final = timedelta(seconds=1)


def encode_failure(failure: PeerFailedError) -> str:
    """A failure as text for the store, read back by `DistributedCollectives`."""
    return json.dumps([failure.rank, failure.exit_code, failure.traceback_tail])


def _decode_failure(text: bytes) -> PeerFailedError:
    rank, exit_code, tail = json.loads(text)
    return PeerFailedError(int(rank), exit_code, str(tail))


T = TypeVar("T")

_TORCH_OPS: Final = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MEAN: dist.ReduceOp.SUM,  # then divided: gloo has no AVG
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}
_MAX_FAST_DIMS: Final = 16
_DTYPES: Final = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
)  # fmt: skip


_WIRE_DTYPES: Final = {torch.int16: torch.int32}
"""Dtypes that gloo and NCCL cannot move, and the wider dtype each travels as."""


def _wire(dtype: torch.dtype) -> torch.dtype:
    return _WIRE_DTYPES.get(dtype, dtype)


def as_timeout(timeout: timedelta | float | None, default: timedelta) -> timedelta:
    """A timeout as a `timedelta`: seconds, a `timedelta`, or ``None`` for ``default``.

    Raises:
        ValueError: It is not positive.
    """
    if timeout is None:
        return default
    value = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
    if value <= timedelta(0):
        raise ValueError(f"timeout={timeout!r} must be positive")
    return value


def _reducible(value: object) -> None:
    if not isinstance(value, torch.Tensor | int | float):
        raise TypeError(
            f"reduce takes a tensor or a Python number, got {type(value).__name__}: "
            "convert the value to a tensor first"
        )


def _reduce_dtype(
    tensor: torch.Tensor, op: ReduceOp, floating: torch.dtype | None = None
) -> torch.dtype:
    # The mean of integers or bools is floating (never truncated): ``floating``, or
    # the default dtype; other reductions of bools count or compare them as integers.
    if op is ReduceOp.MEAN and not (tensor.is_floating_point() or tensor.is_complex()):
        return floating or torch.get_default_dtype()
    if tensor.dtype == torch.bool:
        return torch.int64
    return _wire(tensor.dtype)


def _result_dtype(tensor: torch.Tensor, op: ReduceOp, reduced: torch.dtype) -> torch.dtype:
    if tensor.dtype == torch.bool and op in (ReduceOp.MIN, ReduceOp.MAX):
        return torch.bool
    if reduced == _wire(tensor.dtype):
        return tensor.dtype
    return reduced


def _number_result(value: int | float, op: ReduceOp, reduced: torch.Tensor) -> int | float:
    if op is ReduceOp.MEAN or isinstance(value, float):
        return float(reduced.item())
    return int(reduced.item())


def _check_src(src: object, world_size: int) -> int:
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < world_size:
        raise ValueError(
            f"broadcast src={src!r} is outside the ranks [0, {world_size}): "
            f"pass the global rank that holds the value"
        )
    return src


class LocalCollectives:
    """The contract for a job of one process: every collective is a copy."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @overload
    def reduce(self, value: torch.Tensor, reduce_op: ReduceOpLike = "mean") -> torch.Tensor: ...

    @overload
    def reduce(self, value: float, reduce_op: ReduceOpLike = "mean") -> float: ...

    def reduce(
        self, value: torch.Tensor | float, reduce_op: ReduceOpLike = "mean"
    ) -> torch.Tensor | float:
        """An equal copy of ``value``; the mean of integers is floating."""
        _reducible(value)
        op = ReduceOp.parse(reduce_op)
        if isinstance(value, torch.Tensor):
            dtype = _reduce_dtype(value, op)
            return value.detach().to(_result_dtype(value, op, dtype), copy=True)
        return float(value) if op is ReduceOp.MEAN else value

    def broadcast(self, obj: T, src: int = 0) -> T:
        """``obj`` itself; a tensor is copied to this process's device."""
        _check_src(src, 1)
        if isinstance(obj, torch.Tensor):
            return obj.detach().to(self.device, copy=True)  # type: ignore[return-value]
        return obj

    def barrier(self, name: str | None = None, timeout: timedelta | float | None = None) -> None:
        """Return at once: there is no other rank to wait for."""
        as_timeout(timeout, timedelta(seconds=1))

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` with a leading dimension of 1."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_gather takes a tensor, got {type(tensor).__name__}")
        return tensor.detach().unsqueeze(0).clone()

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002
        """``decision`` itself."""
        return bool(decision)


class Rendezvous:
    """Ranks meeting through a store: each posts a call, all wait, all compare.

    Args:
        store: A store every rank shares.
        rank: This process's rank.
        world_size: The number of ranks.
        prefix: Where in the store this rendezvous keeps its keys.
    """

    def __init__(self, store: dist.Store, *, rank: int, world_size: int, prefix: str) -> None:
        self.store = dist.PrefixStore(prefix, store)
        self._aborts = dist.PrefixStore(STORE_PREFIX, store)  # where launchers post failures
        self.rank = rank
        self.world_size = world_size
        self._sequence = 0

    def meet(self, call: CollectiveCall, timeout: timedelta, note: bytes = b"") -> list[bytes]:
        """Wait until every rank has posted its call, and compare the calls.

        Each rank may attach a ``note``, which travels with its call but is not
        compared (a broadcast's source describes what it sends in it).

        Returns:
            Every rank's note, by rank.

        Raises:
            CollectiveTimeoutError: Some ranks did not arrive within ``timeout``.
            CollectiveMismatchError: The ranks' calls differ.
            PeerFailedError: A rank failed meanwhile (its launcher said so).
        """
        self._sequence += 1
        prefix = f"{self._sequence}/"
        keys = [f"{prefix}{rank}" for rank in range(self.world_size)]
        # The call, and where this rank is: a launcher that sees a rank die fills in
        # the dead rank's entry here, which ends this wait at once.
        # multi_set is one round trip; torch's type stubs omit it, which it has.
        self.store.multi_set(  # type: ignore[attr-defined]
            [keys[self.rank], f"{_AT}{self.rank}"],
            [json.dumps([call.collective, call.params]).encode() + _NOTE + note,
             str(self._sequence)],
        )  # fmt: skip
        try:
            self.store.wait(keys, timeout)
        except (RuntimeError, dist.DistError) as error:
            arrived = [rank for rank, key in enumerate(keys) if self.store.check([key])]
            missing = [rank for rank in range(self.world_size) if rank not in arrived]
            name = dict(call.params).get("name")
            raise CollectiveTimeoutError(
                call.collective,
                name=None if name in (None, "None") else name,
                timeout=timeout.total_seconds(),
                missing_ranks=missing,
                arrived_ranks=arrived,
            ) from error
        posted = self.store.multi_get(keys)
        if _ABORTED.encode() in posted:
            raise _decode_failure(self._aborts.get(ABORT_KEY))
        # JSON text holds no raw newline: the first one ends the call.
        encoded, notes = zip(*(value.partition(_NOTE)[::2] for value in posted), strict=True)
        if len(set(encoded)) > 1:
            calls = {}
            for rank, text in enumerate(encoded):
                collective, params = json.loads(text)
                calls[rank] = CollectiveCall(collective, dict(params))
            raise CollectiveMismatchError(calls)
        # Every rank has passed the previous meeting, so this rank's key of the one
        # before it is read by nobody any more.
        if self._sequence > 2:
            self.store.delete_key(f"{self._sequence - 2}/{self.rank}")
        return list(notes)

    def depart(self, timeout: timedelta) -> None:
        """Say this rank is done with the store; rank 0, which serves it, waits for all.

        Rank 0's store must outlive every other rank's last use of it. The wait ends
        early when a launcher posts a failure, and never raises: it runs in teardown.
        """
        try:
            self.store.set(f"{_LEFT}{self.rank}", "1")
            if self.rank != 0:
                return
            keys = [f"{_LEFT}{rank}" for rank in range(self.world_size)]
            deadline = time.monotonic() + timeout.total_seconds()
            while time.monotonic() < deadline and not self._aborts.check([ABORT_KEY]):
                try:
                    self.store.wait(keys, _DEPARTURE_SLICE)
                except (RuntimeError, dist.DistError):
                    continue  # not every rank has left yet: look for a failure, wait on
                return
        except (RuntimeError, dist.DistError):
            return  # the store is gone (rank 0 failed): nothing is left to wait for


def post_failure(
    store: dist.Store, failure: PeerFailedError, *, world_size: int, prefixes: tuple[str, ...]
) -> None:
    """Tell every rank waiting in a rendezvous that ``failure`` happened.

    The failure goes under `ABORT_KEY`; then, for each rendezvous prefix and each
    rank, the failed rank's entry at that rank's current meeting is filled with a
    marker, so that the wait ends and the rank raises `PeerFailedError`.
    """
    if store.check([CURRENT_RUN_KEY]):  # the keys of the run in progress
        store = dist.PrefixStore(run_prefix(int(store.get(CURRENT_RUN_KEY))), store)
    dist.PrefixStore(STORE_PREFIX, store).set(ABORT_KEY, encode_failure(failure))
    for prefix in prefixes:
        meetings = dist.PrefixStore(prefix, store)
        for rank in range(world_size):
            if rank != failure.rank and meetings.check([f"{_AT}{rank}"]):
                sequence = meetings.get(f"{_AT}{rank}").decode()
                meetings.set(f"{sequence}/{failure.rank}", _ABORTED)


# What a broadcast's src posts in the meeting, as b"KIND:BODY".
_INLINE_TENSOR: Final = b"t"  # dtype index:shape:the tensor's bytes
_TENSOR: Final = b"T"  # dtype index:shape; the data follows in a broadcast
_INLINE_OBJECT: Final = b"o"  # the pickled object
_PICKLED: Final = b"O"  # the pickle's length; the pickle follows in a broadcast
_UNPICKLABLE: Final = b"E"  # why the object cannot be pickled
_INLINE_BYTES: Final = 8 * 1024
"""Values up to this size travel in the meeting itself: no broadcast at all."""
_INLINE_ALL_BYTES: Final = 32 * 1024
"""A reduce or all_gather whose tensors take up to this much over all ranks travels in
the meeting, where every rank reads every rank's tensor: no collective at all."""


def _combine(rows: list[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    """Reduce every rank's row, in rank order (the same result on every rank)."""
    result = rows[0]
    for row in rows[1:]:
        if op is ReduceOp.MIN:
            torch.minimum(result, row, out=result)
        elif op is ReduceOp.MAX:
            torch.maximum(result, row, out=result)
        elif op is ReduceOp.PRODUCT:
            result *= row
        else:  # sum, and mean before its division
            result += row
    return result


def _fast(obj: object) -> bool:
    return isinstance(obj, torch.Tensor) and obj.dtype in _DTYPES and obj.dim() <= _MAX_FAST_DIMS


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous()
    size = flat.numel() * flat.element_size()
    return ctypes.string_at(flat.data_ptr(), size) if size else b""


def _tensor_from_bytes(data: bytes, dtype: torch.dtype, dims: list[int]) -> torch.Tensor:
    if not data:
        return torch.empty(dims, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(dims)


def _own_copy(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.detach().to(device, memory_format=torch.contiguous_format, copy=True)


def _describe(obj: object, *, inline: bool) -> tuple[bytes, bytes]:
    """What src posts about ``obj`` (see the kinds above), and its pickle if it made one."""
    if _fast(obj):
        assert isinstance(obj, torch.Tensor)
        head = f"{_DTYPES.index(obj.dtype)}:{','.join(map(str, obj.shape))}".encode()
        if inline and obj.numel() * obj.element_size() <= _INLINE_BYTES:
            return _INLINE_TENSOR + b":" + head + b":" + _tensor_bytes(obj), b""
        return _TENSOR + b":" + head, b""
    try:
        pickled = pickle.dumps(obj)
    except Exception as error:  # noqa: BLE001 - any failure is reported to every rank
        return _UNPICKLABLE + b":" + f"{type(error).__name__}: {error}".encode(), b""
    if inline and len(pickled) <= _INLINE_BYTES:
        return _INLINE_OBJECT + b":" + pickled, pickled
    return _PICKLED + b":" + str(len(pickled)).encode(), pickled


class DistributedCollectives:
    """The contract over a torch.distributed process group, checked through its store.

    Args:
        group: The process group the collectives run on.
        store: A store every rank of the group shares, for checks and barriers.
        rank: This process's rank in the group.
        world_size: The group's size.
        device: This process's device, where results land.
        checked: Compare every rank's call before running a collective.
        timeout: How long a rank waits for the others (steady state).
    """

    def __init__(
        self,
        *,
        group: dist.ProcessGroup,
        store: dist.Store,
        rank: int,
        world_size: int,
        device: torch.device,
        checked: bool = True,
        timeout: timedelta = timedelta(minutes=30),
    ) -> None:
        self.group = group
        self._rendezvous = Rendezvous(store, rank=rank, world_size=world_size, prefix=STORE_PREFIX)
        self.store = self._rendezvous.store
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.checked = checked
        self.timeout = timeout
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
            and work.numel() * work.element_size() * self.world_size <= _INLINE_ALL_BYTES
        )

    def _exchange(
        self, work: torch.Tensor, collective: str, **params: object
    ) -> list[torch.Tensor]:
        """Every rank's ``work``, by rank, read from the meeting that checks the call."""
        notes = self.rendezvous(
            CollectiveCall(collective, params), self.timeout, _tensor_bytes(work)
        )
        return [_tensor_from_bytes(note, work.dtype, list(work.shape)) for note in notes]

    # The collectives.

    @overload
    def reduce(self, value: torch.Tensor, reduce_op: ReduceOpLike = "mean") -> torch.Tensor: ...

    @overload
    def reduce(self, value: float, reduce_op: ReduceOpLike = "mean") -> float: ...

    def reduce(
        self, value: torch.Tensor | float, reduce_op: ReduceOpLike = "mean"
    ) -> torch.Tensor | float:
        """Reduce over every rank, out of place; the mean of integers is floating."""
        _reducible(value)
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
        dtype = _reduce_dtype(
            tensor, op, None if isinstance(value, torch.Tensor) else torch.float64
        )
        # Contiguous, so that element i is element i on every rank whatever the
        # caller's strides (a collective runs over the memory as laid out).
        work = tensor.detach().to(
            self.comm_device, dtype, copy=True, memory_format=torch.contiguous_format
        )
        if self._inline(work) and not work.is_complex():
            work = _combine(self._exchange(work, "reduce", **call), op)
        else:
            self._check("reduce", **call)
            dist.all_reduce(work, op=_TORCH_OPS[op], group=self.group)
        if op is ReduceOp.MEAN:
            work /= self.world_size
        if isinstance(value, torch.Tensor):
            return work.to(value.device, _result_dtype(value, op, dtype))
        return _number_result(value, op, work)

    def broadcast(self, obj: T, src: int = 0) -> T:
        """Give every rank a value equal to ``src``'s; tensors travel without pickling.

        Checked, ``src`` describes the value in the meeting that checks the call
        (dtype and shape of a tensor, or the value itself when it is small and the
        group moves CPU tensors), so that the value needs one broadcast at most.
        Unchecked, a header broadcast describes it first.

        Raises:
            TypeError: ``src``'s object cannot be pickled (raised on every rank).
        """
        src = _check_src(src, self.world_size)
        if self.world_size == 1:  # as a single process's collectives: nothing moves
            if isinstance(obj, torch.Tensor):
                return _own_copy(obj, self.device)  # type: ignore[return-value]
            return obj
        if not self.checked:
            return self._broadcast_with_header(obj, src)
        return self._broadcast_described(obj, src)

    def _broadcast_described(self, obj: T, src: int) -> T:
        note = pickled = b""
        if self.rank == src:
            note, pickled = _describe(obj, inline=self.comm_device.type == "cpu")
        notes = self.rendezvous(CollectiveCall("broadcast", {"src": src}), self.timeout, note)
        kind, _, body = notes[src].partition(b":")
        if kind == _UNPICKLABLE:
            message = f"broadcast: src={src}'s object cannot be pickled: {body.decode()}"
            raise TypeError(message)
        if kind == _INLINE_OBJECT:
            return obj if self.rank == src else pickle.loads(body)
        if kind == _PICKLED:
            return self._broadcast_pickled(obj, src, pickled, int(body))
        dtype_index, shape, *inline = body.split(b":", 2)
        dtype = _DTYPES[int(dtype_index)]
        dims = [int(size) for size in shape.split(b",") if size]
        if kind == _TENSOR:
            return self._broadcast_tensor(obj, src, dtype, dims)  # type: ignore[return-value]
        if self.rank == src:  # the tensor travelled inline
            assert isinstance(obj, torch.Tensor)
            return _own_copy(obj, self.device)  # type: ignore[return-value]
        return _tensor_from_bytes(inline[0], dtype, dims).to(self.device)  # type: ignore[return-value]

    def _broadcast_with_header(self, obj: T, src: int) -> T:
        header = torch.zeros(2 + _MAX_FAST_DIMS, dtype=torch.int64, device=self.comm_device)
        if self.rank == src and _fast(obj):
            assert isinstance(obj, torch.Tensor)
            header[0] = 1 + _DTYPES.index(obj.dtype)
            header[1] = obj.dim()
            header[2 : 2 + obj.dim()] = torch.tensor(obj.shape, dtype=torch.int64)
        dist.broadcast(header, src=src, group=self.group)
        kind, ndim = int(header[0]), int(header[1])
        if kind == 0:
            box = [obj if self.rank == src else None]
            dist.broadcast_object_list(box, src=src, group=self.group)
            return box[0]  # type: ignore[return-value]
        dims = header[2 : 2 + ndim].tolist()
        return self._broadcast_tensor(obj, src, _DTYPES[kind - 1], dims)  # type: ignore[return-value]

    def _broadcast_tensor(
        self, obj: object, src: int, dtype: torch.dtype, dims: list[int]
    ) -> torch.Tensor:
        if self.rank == src:
            assert isinstance(obj, torch.Tensor)
            buffer = obj.detach().to(self.comm_device, _wire(dtype)).contiguous()
            if buffer.untyped_storage().data_ptr() != obj.untyped_storage().data_ptr():
                dist.broadcast(buffer, src=src, group=self.group)  # a copy already
                return buffer.to(self.device, dtype)
            work = dist.broadcast(buffer, src=src, group=self.group, async_op=True)
            # The buffer is the caller's tensor: src's result is a copy of its own,
            # made while the data travels.
            result = _own_copy(obj, self.device)
            work.wait()
            return result
        buffer = torch.empty(dims, dtype=_wire(dtype), device=self.comm_device)
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
        return pickle.loads(_tensor_bytes(buffer.cpu()))  # type: ignore[no-any-return]

    def barrier(self, name: str | None = None, timeout: timedelta | float | None = None) -> None:
        """Wait until every rank has entered; name the missing ranks on timeout.

        Raises:
            CollectiveTimeoutError: ``timeout`` passed before every rank arrived.
            CollectiveMismatchError: Ranks entered barriers of different names, or
                other collectives (in checked mode).
        """
        self.rendezvous(
            CollectiveCall("barrier", {"name": name}), as_timeout(timeout, self.timeout)
        )

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack every rank's ``tensor``: row ``i`` is rank ``i``'s."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_gather takes a tensor, got {type(tensor).__name__}")
        call = {"shape": tuple(tensor.shape), "dtype": tensor.dtype}
        work = tensor.detach().to(self.comm_device, _wire(tensor.dtype)).contiguous()
        if self._inline(work):
            rows = self._exchange(work, "all_gather", **call)
        else:
            self._check("all_gather", **call)
            rows = [torch.empty_like(work) for _ in range(self.world_size)]
            dist.all_gather(rows, work, group=self.group)
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
