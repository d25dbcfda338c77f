"""Where each rank runs, compared across the job once, when the ranks meet at start-up.

Each rank posts its host, its ranks and its device to the job's store; rank 0 reads
them all in one request, checks that they make one consistent layout, and posts its
verdict, which every rank reads. A layout that cannot be right (two ranks on one GPU
under NCCL, two ranks with one local rank on one node, one node spread over two hosts) raises
the same `ConfigurationError` on every rank, naming the ranks, before the process
group forms: not a cryptic backend error, a hang or silently shared hardware later.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Final

import attrs
import torch
import torch.distributed as dist

from plait.core import ClusterEnvironment, CollectiveTimeoutError, ConfigurationError

__all__ = [
    "Placement",
    "agree_on_placement",
    "check_placements",
    "placement_of",
    "shares_devices",
]

_POSTED: Final = "placement/"
_VERDICT: Final = "placement-verdict"
_AGREED: Final = "ok"
_READ: Final = "placement-read/"
_READ_WINDOW: Final = timedelta(seconds=30)


@attrs.frozen(kw_only=True)
class Placement:
    """Where one rank runs, as it sees it.

    Attributes:
        rank: Its global rank.
        local_rank: Its rank on its node.
        node_rank: Its node's rank.
        host: Its host name.
        device: Its device (``"cuda:0"``).
        device_id: What names the physical device across the job (a GPU's UUID), or
            ``None`` for a device processes may share (the CPU).
    """

    rank: int
    local_rank: int
    node_rank: int
    host: str
    device: str
    device_id: str | None

    def encode(self) -> str:
        """The placement as JSON, as it is posted."""
        return json.dumps(attrs.asdict(self))

    @classmethod
    def decode(cls, text: str | bytes) -> Placement:
        """A placement from its JSON."""
        return cls(**json.loads(text))


def _device_id(device: torch.device) -> str | None:
    # Only an accelerator one process owns is compared; the CPU is shared by design,
    # and other backends (XLA) number each process's own device from 0.
    if device.type != "cuda":
        return None
    # Under srun --gpu-bind or CUDA_VISIBLE_DEVICES, cuda:0 is another GPU in each
    # process: the UUID names the hardware itself.
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"


def placement_of(environment: ClusterEnvironment, device: torch.device) -> Placement:
    """This process's placement: its environment's ranks, this host, and its device."""
    return Placement(
        rank=environment.global_rank,
        local_rank=environment.local_rank,
        node_rank=environment.node_rank,
        host=socket.gethostname(),
        device=str(device),
        device_id=_device_id(device),
    )


def _ranks(ranks: Sequence[int]) -> str:
    listed = sorted(ranks)
    if len(listed) == 1:
        return f"rank {listed[0]}"
    if len(listed) == 2:
        return f"ranks {listed[0]} and {listed[1]}"
    return "ranks " + ", ".join(str(rank) for rank in listed)


@attrs.frozen
class _Problem:
    message: str
    value: int | str
    fix: str

    def error(self) -> ConfigurationError:
        return ConfigurationError(self.message, value=self.value, fix=self.fix)


def check_placements(
    placements: Sequence[Placement],
    variables: Mapping[str, str] | None = None,
    *,
    shared_devices: bool = False,
) -> ConfigurationError | None:
    """The first thing wrong with the job's layout, as the error to raise, or ``None``.

    Args:
        placements: Every rank's placement.
        variables: The variable each of ``local_rank`` and ``node_rank`` is read
            from in this environment, for the message.
        shared_devices: Whether ranks may share a GPU: over gloo, which stages CUDA
            tensors through host memory, they may; NCCL refuses two ranks on one GPU.
    """
    problem = _problem(placements, variables or {}, shared_devices=shared_devices)
    return None if problem is None else problem.error()


def shares_devices(backend: str) -> bool:
    """Whether ranks of a process group of ``backend`` may share a GPU (gloo's may)."""
    return backend == "gloo"


def _problem(
    placements: Sequence[Placement], named: Mapping[str, str], *, shared_devices: bool
) -> _Problem | None:
    def source(field: str) -> str:
        return f" ({named[field]})" if field in named else ""

    devices: dict[str, list[Placement]] = defaultdict(list)
    slots: dict[tuple[int, int], list[int]] = defaultdict(list)
    hosts: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for placement in placements:
        if placement.device_id is not None and not shared_devices:
            devices[placement.device_id].append(placement)
        slots[placement.node_rank, placement.local_rank].append(placement.rank)
        hosts[placement.node_rank][placement.host].append(placement.rank)
    for device_id, sharing in sorted(devices.items()):
        if len(sharing) > 1:
            where = ", ".join(
                f"rank {p.rank} as {p.device} on {p.host!r}" for p in sorted(sharing, key=_rank)
            )
            return _Problem(
                f"{_ranks([p.rank for p in sharing])} use the same device, {device_id} "
                f"({where}): each process needs a device of its own",
                device_id,
                "start one process per device on each node (torchrun --nproc-per-node, "
                "srun --ntasks-per-node) and check each process's local rank"
                f"{source('local_rank')} and CUDA_VISIBLE_DEVICES (srun --gpu-bind); to "
                "share a GPU on purpose (a test), use process_group_backend='gloo'",
            )
    for (node, local), ranks in sorted(slots.items()):
        if len(ranks) > 1:
            return _Problem(
                f"{_ranks(ranks)} say they are local rank {local}{source('local_rank')} "
                f"on node {node}{source('node_rank')}: each process on a node needs a local "
                "rank of its own",
                local,
                "check how the processes were started: the launcher or scheduler sets "
                "the local rank; one set by hand must differ on each process of a node",
            )
    for node, by_host in sorted(hosts.items()):
        if len(by_host) > 1:
            spread = "; ".join(
                f"{host!r}: {_ranks(ranks)}" for host, ranks in sorted(by_host.items())
            )
            return _Problem(
                f"node {node}{source('node_rank')} is on {len(by_host)} hosts ({spread}): "
                "the ranks of one node must share its host",
                node,
                "give each host its own node rank (torchrun --node-rank, or let "
                "torchrun's c10d rendezvous number the nodes), and start the same number "
                "of processes on each",
            )
    return None


def _rank(placement: Placement) -> int:
    return placement.rank


def agree_on_placement(
    store: dist.Store,
    environment: ClusterEnvironment,
    device: torch.device,
    *,
    timeout: timedelta,
    post: bool = True,
    shared_devices: bool = False,
) -> None:
    """Check the job's layout once, the same on every rank.

    Every rank must call it after posting its placement (``post=True`` posts it
    here) and after every rank has posted: after the ranks have met at start-up.

    Args:
        store: The job's store, under this run's prefix.
        environment: This process's place in the job.
        device: This process's device.
        timeout: How long a rank waits for rank 0's verdict.
        post: Post this rank's placement first.
        shared_devices: Whether ranks may share a GPU (see `check_placements`).

    Raises:
        ConfigurationError: The layout cannot be right; the same error on every rank.
        CollectiveTimeoutError: Rank 0's verdict did not come within ``timeout``.
    """
    if post:
        post_placement(store, environment, device)
    world_size = environment.world_size
    if environment.global_rank == 0:
        keys = [f"{_POSTED}{rank}" for rank in range(world_size)]
        store.wait(keys, timeout)
        posted = [Placement.decode(text) for text in store.multi_get(keys)]
        named = getattr(environment, "variables", None) or {}
        problem = _problem(posted, named, shared_devices=shared_devices)
        store.set(_VERDICT, _AGREED if problem is None else json.dumps(attrs.asdict(problem)))
    else:
        try:
            store.wait([_VERDICT], timeout)
        except (RuntimeError, dist.DistError) as lost:
            raise CollectiveTimeoutError(
                "start-up",
                name="placement check",
                timeout=timeout.total_seconds(),
                missing_ranks=[0],
                arrived_ranks=[environment.global_rank],
            ) from lost
    verdict = store.get(_VERDICT).decode()
    if verdict == _AGREED:
        return
    read = [f"{_READ}{rank}" for rank in range(1, world_size)]
    if environment.global_rank == 0:
        # Rank 0 may serve the store: it stays until every rank has read the verdict
        # (or the time is up), so that each raises this error, not a lost connection.
        with contextlib.suppress(RuntimeError, dist.DistError):
            store.wait(read, min(timeout, _READ_WINDOW))
    else:
        store.set(read[environment.global_rank - 1], "1")
    raise _Problem(**json.loads(verdict)).error()


def post_placement(
    store: dist.Store, environment: ClusterEnvironment, device: torch.device
) -> None:
    """Post this rank's placement, for `agree_on_placement`."""
    store.set(f"{_POSTED}{environment.global_rank}", placement_of(environment, device).encode())
