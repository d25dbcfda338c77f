"""A persistent pool of rank processes that runs one example at a time on every rank.

The ranks start once per (strategy, backend, world size): each builds the strategy
and joins its process group once, then runs every example it is sent. An example
that does not finish by its deadline, or a rank that dies, fails that example with
every rank's stack, and the pool starts afresh for the next one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import multiprocessing.connection
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Final

import attrs
import torch.distributed as dist
from typing_extensions import Self, override

from plait.conformance import worker
from plait.conformance.hangs import STRAGGLER_GRACE, hang_headline, straggler_grace, waiting_in
from plait.conformance.lanes import LANES, RANK_THREADS, UNHELD_DTYPES, backend_unavailable
from plait.conformance.mesh import mesh_text
from plait.conformance.outcomes import Outcome, RaisedError
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.target import StrategyFactory, StrategyTarget
from plait.core import ConfigurationError, TrainingSemantics
from plait.core.network import free_port

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess
    from types import TracebackType

    from plait.conformance.cases import Case
    from plait.conformance.mesh import MeshLayout

__all__ = [
    "LANES",
    "RANK_MODULES",
    "STRAGGLER_GRACE",
    "UNHELD_DTYPES",
    "GroupOutcomes",
    "MeshDimension",
    "PoolError",
    "PoolStartError",
    "RankCrashError",
    "RankHangError",
    "RankPool",
    "backend_unavailable",
    "fork_server_modules",
    "preload",
    "straggler_grace",
    "waiting_in",
]

_STACK_WAIT: Final = 5.0  # seconds a stuck rank has to answer for its stack

RANK_MODULES: Final = ("plait.conformance.worker", "torch._dynamo")
"""What the ranks' fork server always imports first: the worker, and what torch imports
at a process's first optimizer (``torch.optim`` brings in ``torch._dynamo``: about
0.65 s of CPU, which every rank of every pool would pay)."""

_preloaded: list[str] = []


def preload(*modules: str) -> None:
    """Have the ranks' fork server import ``modules`` too, once, before its first rank.

    Every rank of every pool is a fork of one server per test process, started with
    the first pool: what it imported, no rank imports again. Name here what your
    strategy's ranks import that its own module does not (a backend it imports
    lazily, say), to pay for it once per test process instead of once per rank. The
    ``plait_preload`` ini option calls this when pytest starts. Only a call before the
    process's first pool (or other use of multiprocessing's fork server) counts.

    Raises:
        ConfigurationError: A name is not a module that can be found.
    """
    for module in modules:
        if not all(map(str.isidentifier, str(module).split("."))):
            raise ConfigurationError(
                f"preload: {module!r} is not a module name",
                value=module,
                fix="name modules as an import does, e.g. 'deepspeed' or 'mypackage.ops'",
            )
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # its parent package is missing
            found = False
        if not found:
            raise ConfigurationError(
                f"preload: no module {module!r} can be imported here",
                value=module,
                fix="install it, or name a module on sys.path (a package's, or a file "
                "beside your tests when pytest's pythonpath holds its folder)",
            )
        if module not in _preloaded:
            _preloaded.append(module)


def fork_server_modules(*first: str) -> list[str]:
    """What the ranks' fork server imports, in this order.

    `RANK_MODULES`, ``first`` (a strategy's own modules), what `preload` named, and
    last ``plait.conformance.frozen``, which freezes what the others made.
    """
    return [*RANK_MODULES, *first, *_preloaded, "plait.conformance.frozen"]


_GONE: Final = object()


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _wait(connections: list[Connection], timeout: float) -> list[Connection]:
    """The connections with a message (or closed by their rank) within ``timeout``."""
    ready = multiprocessing.connection.wait(connections, timeout=timeout)
    return [item for item in connections if item in ready]


def _receive(connection: Connection) -> object:
    """The next message, or `_GONE` when the rank has closed its end (it died)."""
    try:
        return connection.recv()
    except (EOFError, OSError):
        return _GONE


class PoolError(AssertionError):
    """An example did not complete on every rank: a hang or a crash."""


class RankHangError(PoolError):
    """Some ranks did not finish an example by its deadline."""


class RankCrashError(PoolError):
    """A rank process died during an example."""


class PoolStartError(RuntimeError):
    """The ranks could not build the strategy or join its process group."""


def _idle_ranks(case: Case, groups: tuple[tuple[int, ...], ...]) -> frozenset[int]:
    """The ranks that call nothing in ``case``: their return says nothing of the others."""
    places = EXAMPLE_KINDS.kind_of(case).idle_places(case)
    return frozenset(group[place] for group in groups for place in places if place < len(group))


def _rank_environ(
    rank: int, world_size: int, backend: str, port: int, run_id: str
) -> dict[str, str]:
    environ = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "TORCHELASTIC_RUN_ID": run_id,
        "PLAIT_CLUSTER_ENVIRONMENT": "torchelastic",
        "PLAIT_CONFORMANCE_BACKEND": backend,
        "OMP_NUM_THREADS": str(RANK_THREADS),
    }
    if backend == "gloo":
        environ["CUDA_VISIBLE_DEVICES"] = ""
    return environ


class RankPool:
    """``world_size`` rank processes running ``target``'s strategy on ``backend``.

    Use it as a context manager, or call `close`; `run` starts it when needed.

    Args:
        target: The strategy: a registered name, ``"module:factory"``, or a factory.
        world_size: The number of ranks.
        backend: The lane: ``"gloo"`` (CPU), ``"gloo-cuda"`` (gloo with CUDA tensors,
            the ranks sharing the GPUs), ``"nccl"`` (CUDA) or ``"xla"``.
        deadline: Seconds an example may take on every rank before it counts as a hang.
        start_timeout: Seconds the ranks may take to build the strategy and join.
        mesh: The sizes of a device mesh's dimensions: the factory is called with
            ``mesh_shape=mesh``, and `along` runs examples over each dimension's groups.

    Raises:
        ConfigurationError: ``world_size`` or a timeout is not positive, ``backend``
            is not a lane, or ``mesh`` is not a tuple of positive sizes.
    """

    def __init__(
        self,
        target: str | StrategyFactory | StrategyTarget,
        *,
        world_size: int,
        backend: str = "gloo",
        deadline: float = 30.0,
        start_timeout: float = 120.0,
        mesh: tuple[int, ...] = (),
    ) -> None:
        if not _positive_int(world_size):
            raise ConfigurationError(
                f"world_size={world_size!r} must be a positive int",
                value=world_size,
                fix="pass the number of ranks, e.g. world_size=2",
            )
        if backend not in LANES:
            raise ConfigurationError.invalid_choice("backend", backend, tuple(LANES))
        for name, value in (("deadline", deadline), ("start_timeout", start_timeout)):
            if not value > 0:
                raise ConfigurationError(
                    f"{name}={value!r} must be a positive number of seconds",
                    value=value,
                    fix=f"pass e.g. {name}=30",
                )
        self.target = StrategyTarget.of(target)
        if mesh or self.target.mesh:
            self.target = attrs.evolve(self.target, mesh=mesh)
        self.world_size = world_size
        self.backend = backend
        self.deadline = float(deadline)
        self.start_timeout = float(start_timeout)
        self.devices: tuple[str, ...] = ()
        self.layout: MeshLayout | None = None
        """The strategy's mesh, once the ranks are up (with ``mesh`` only)."""
        self.semantics = TrainingSemantics()
        """What the strategy declares about training, once the ranks are up."""
        self.starts = 0
        self._processes: list[BaseProcess] = []
        self._tasks: list[Connection] = []
        self._controls: list[Connection] = []
        self._sequence = 0
        self._evidence: dist.TCPStore | None = None

    @property
    def running(self) -> bool:
        """Whether the ranks are up."""
        return bool(self._processes)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @override
    def __repr__(self) -> str:
        mesh = f", mesh={self.target.mesh}" if self.target.mesh else ""
        return (
            f"RankPool({self.target.name!r}, world_size={self.world_size}, "
            f"backend={self.backend!r}{mesh})"
        )

    @property
    def where(self) -> str:
        """The lane in words, as a failure's headline names it."""
        mesh = f", mesh {mesh_text(self.target.mesh)}" if self.target.mesh else ""
        return f"{self.backend}, world size {self.world_size}{mesh}"

    @property
    def rerun(self) -> dict[str, object]:
        """The keyword arguments of `plait.conformance.reproduce` that rebuild this lane."""
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            **({"mesh": self.target.mesh} if self.target.mesh else {}),
        }

    def along(self, dimension: str) -> MeshDimension:
        """This pool's ranks in groups along ``dimension`` of the strategy's mesh.

        Raises:
            ConfigurationError: The pool was made without a mesh, or the mesh has no
                such dimension (the names it has are listed).
            PoolStartError: The pool was down and could not start.
        """
        if not self.target.mesh:
            raise ConfigurationError(
                f"{self!r} was made without a mesh, so it has no dimension {dimension!r}",
                value=dimension,
                fix="make the pool with mesh=(...), the sizes of the mesh's dimensions",
            )
        self.start()
        assert self.layout is not None
        self.layout.groups(dimension)  # the dimension exists
        return MeshDimension(self, dimension)

    @property
    def dimensions(self) -> tuple[str, ...]:
        """The names of the mesh's dimensions (none without a mesh); starts the pool."""
        if not self.target.mesh:
            return ()
        self.start()
        assert self.layout is not None
        return self.layout.names

    def prepare(self, case: Case) -> Case:
        """``case`` as the ranks run it: as it is (see `MeshDimension.prepare`)."""
        return case

    def run_groups(self, case: Case, *, slower: float = 1.0) -> list[GroupOutcomes]:
        """Run ``case`` over the world: one group, every rank (see `MeshDimension`).

        ``slower`` times the pool's deadline is the example's (a training run's).
        """
        ranks = tuple(range(self.world_size))
        return [GroupOutcomes(ranks, self.run(case, deadline=self.deadline * slower), self.devices)]

    # Starting and stopping.

    def start(self) -> None:
        """Start the ranks and wait until each has joined the process group.

        Raises:
            PoolStartError: A rank could not build the strategy or join, or the
                strategy's ranks do not match the pool (a one-process strategy in a
                pool of several, a device of another type than the lane's).
        """
        if self.running:
            return
        for attempt in range(3):
            try:
                self._start()
                return
            except PoolStartError as error:  # noqa: PERF203 - at most three tries
                # Another process may take the rendezvous port between choosing it
                # and binding it; only that is worth another try.
                if attempt == 2 or "address already in use" not in str(error).lower():
                    raise

    def _start(self) -> None:
        # Imported here too, as the plugin does: a bad reference fails now, naming the
        # problem, and what the ranks send that names the target's module (a factory
        # it declares in its training semantics) unpickles here, for a file's module too.
        self.target.factory()
        if self._evidence is None:
            self._evidence = dist.TCPStore(
                "127.0.0.1", 0, is_master=True, wait_for_workers=False,
                timeout=timedelta(seconds=60),
            )  # fmt: skip
        context = multiprocessing.get_context("forkserver")
        # Ranks fork from a server that has imported these once; it starts with the
        # first pool of the process, whose strategy's modules it keeps.
        context.set_forkserver_preload(fork_server_modules(*self.target.modules()))
        port = free_port()
        run_id = f"plait-conformance-{uuid.uuid4().hex[:8]}"
        for rank in range(self.world_size):
            tasks, their_tasks = context.Pipe()
            control, their_control = context.Pipe()
            process = context.Process(
                target=worker.main,
                kwargs={
                    "rank": rank,
                    "environ": _rank_environ(rank, self.world_size, self.backend, port, run_id),
                    "target": self.target,
                    "tasks": their_tasks,
                    "control": their_control,
                    "evidence_address": ("127.0.0.1", self._evidence.port),
                },
                name=f"plait-conformance-rank-{rank}",
                daemon=True,
            )
            process.start()
            their_tasks.close()
            their_control.close()
            self._processes.append(process)
            self._tasks.append(tasks)
            self._controls.append(control)
        self.starts += 1
        try:
            infos = self._gather_start()
        except BaseException:
            self._kill()
            raise
        self.devices = tuple(info.root_device for info in infos)
        self.layout = infos[0].mesh
        self.semantics = infos[0].semantics

    def _gather_start(self) -> list[worker.WorkerReport]:
        pending: dict[Connection, int] = dict(zip(self._tasks, range(self.world_size), strict=True))
        infos: dict[int, worker.WorkerReport] = {}
        failures: dict[int, str] = {}
        limit = time.monotonic() + self.start_timeout
        while pending:
            if failures:  # the others, which likely fail alike, have a moment to say so
                limit = min(limit, time.monotonic() + _STACK_WAIT)
            ready = _wait(list(pending), timeout=max(0.0, limit - time.monotonic()))
            if not ready and failures:
                break
            if not ready:
                raise PoolStartError(
                    f"{self!r}: ranks {sorted(pending.values())} did not join within "
                    f"{self.start_timeout:.0f} s\n"
                    + "\n".join(self._stacks(sorted(pending.values())))
                )
            for connection in ready:
                rank = pending.pop(connection)
                message = _receive(connection)
                if message is _GONE:
                    code = self._processes[rank].exitcode
                    failures[rank] = f"the process exited with code {code} while starting"
                elif isinstance(message, RaisedError):
                    failures[rank] = message.traceback
                elif isinstance(message, worker.WorkerReport):
                    infos[rank] = message
                else:
                    failures[rank] = f"the rank sent {message!r} instead of its place"
        if failures:
            # Ranks that fail alike (a factory that raises fails on every rank) are
            # reported once, naming them all.
            alike: dict[str, list[int]] = {}
            for rank, text in sorted(failures.items()):
                alike.setdefault(text, []).append(rank)
            details = "\n".join(
                f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}:\n{text}"
                for text, ranks in alike.items()
            )
            raise PoolStartError(f"{self!r} could not start:\n{details}")
        ordered = [infos[rank] for rank in range(self.world_size)]
        self._check_ranks(ordered)
        return ordered

    def _check_ranks(self, infos: list[worker.WorkerReport]) -> None:
        for info in infos:
            if info.world_size != self.world_size or info.global_rank != info.rank:
                raise PoolStartError(
                    f"{self!r}: rank {info.rank} reports world_size={info.world_size} and "
                    f"global_rank={info.global_rank}; a strategy of one process cannot be "
                    f"tested at world size {self.world_size}"
                )
            if info.mesh != infos[0].mesh:
                raise PoolStartError(
                    f"{self!r}: the ranks see different meshes: rank 0 {infos[0].mesh}, "
                    f"rank {info.rank} {info.mesh}"
                )
            device_type = info.root_device.split(":")[0]
            if device_type != LANES[self.backend]:
                raise PoolStartError(
                    f"{self!r}: rank {info.rank} runs on {info.root_device}, but the "
                    f"{self.backend} lane tests strategies on {LANES[self.backend]} devices"
                )

    def close(self) -> None:
        """Ask the ranks to leave their process group and exit; kill any that do not."""
        for connection in self._tasks:
            with contextlib.suppress(OSError):
                connection.send(None)
        for process in self._processes:
            process.join(timeout=10)
        self._kill()

    def _kill(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.kill()
        for process in self._processes:
            process.join(timeout=10)
            process.close()
        for connection in (*self._tasks, *self._controls):
            connection.close()
        self._processes = []
        self._tasks = []
        self._controls = []
        self.devices = ()
        self.layout = None

    # Running examples.

    def run(
        self, case: Case, *, deadline: float | None = None, dimension: str | None = None
    ) -> list[Outcome]:
        """Run ``case`` on every rank and return each rank's outcome, in rank order.

        With ``dimension``, every group along that dimension of the mesh runs it at
        once, each rank at its place in its group (`along` reads the outcomes so).

        Raises:
            RankHangError: Some ranks did not finish within the deadline; the message
                holds every rank's stack. The pool restarts on the next call.
            RankCrashError: A rank died; the message holds its exit code and the
                other ranks' stacks.
            PoolStartError: The pool was down and could not start.
        """
        self.start()
        self._sequence += 1
        for connection in self._tasks:
            connection.send((self._sequence, case, dimension))
        pending: dict[Connection, int] = dict(zip(self._tasks, range(self.world_size), strict=True))
        outcomes: dict[int, Outcome] = {}
        allowed = self.deadline if deadline is None else deadline
        started = time.monotonic()
        limit = started + allowed
        first_back: float | None = None
        groups = (
            (tuple(range(self.world_size)),)
            if dimension is None or self.layout is None
            else self.layout.groups(dimension)
        )
        idle = _idle_ranks(case, groups)
        while pending:
            ready = _wait(list(pending), timeout=max(0.0, limit - time.monotonic()))
            if not ready:
                stuck = sorted(pending.values())
                stacks = self._stacks(stuck)
                report = self._report(outcomes, stacks)
                self._kill()
                raise RankHangError(
                    hang_headline(stuck, sorted(set(outcomes) - idle), stacks, allowed, first_back)
                    + f"\nevery rank:\n{report}"
                )
            for connection in ready:
                rank = pending.pop(connection)
                outcome = _receive(connection)
                if isinstance(outcome, Outcome):
                    outcomes[rank] = outcome
                    if first_back is None and pending and rank not in idle:
                        # The others must follow soon: a rank left behind is stuck.
                        first_back = time.monotonic() - started
                        limit = min(limit, time.monotonic() + straggler_grace(first_back))
                else:
                    self._processes[rank].join(timeout=_STACK_WAIT)
                    code = self._processes[rank].exitcode
                    others = [other for other in pending.values() if other != rank]
                    report = self._report(outcomes, self._stacks(others))
                    self._kill()
                    raise RankCrashError(
                        f"rank {rank} died (exit code {code}) during the example; "
                        f"every other rank:\n{report}"
                    ) from None
        return [outcomes[rank] for rank in range(self.world_size)]

    def restart(self) -> None:
        """Stop the ranks and start them again, with a fresh process group."""
        self._kill()
        self.start()

    def _report(self, outcomes: dict[int, Outcome], stacks: list[str]) -> str:
        lines = []
        for rank, outcome in sorted(outcomes.items()):
            done = outcome.error.describe() if outcome.error else "returned"
            lines.append(f"rank {rank}: finished ({done})")
        lines += stacks
        return "\n".join(lines)

    def _stacks(self, ranks: list[int]) -> list[str]:
        asked: dict[Connection, int] = {}
        for rank in ranks:
            with contextlib.suppress(OSError):
                self._controls[rank].send("stack")
                asked[self._controls[rank]] = rank
        answers: dict[int, str] = {}
        limit = time.monotonic() + _STACK_WAIT
        while asked:
            ready = _wait(list(asked), timeout=max(0.0, limit - time.monotonic()))
            if not ready:
                break
            for connection in ready:
                rank = asked.pop(connection)
                answer = _receive(connection)
                answers[rank] = (
                    answer if isinstance(answer, str) else "(the rank exited before it answered)"
                )
        return [
            f"rank {rank} (pid {self._pid(rank)}) is stuck here:\n"
            + answers.get(rank, "(no answer: the rank does not release the interpreter)")
            for rank in ranks
        ]

    def _pid(self, rank: int) -> int | None:
        return self._processes[rank].pid if rank < len(self._processes) else None


@attrs.frozen
class GroupOutcomes:
    """One group's outcomes of an example, numbered as the example numbers its ranks.

    Attributes:
        members: The group's global ranks, in its order.
        outcomes: Each member's outcome; the ranks that errors name are places in
            the group as well (a rank outside it keeps its global number).
        devices: Each member's ``root_device``.
        dimension: The mesh dimension the group lies along (None: the world).
    """

    members: tuple[int, ...]
    outcomes: list[Outcome]
    devices: tuple[str, ...]
    dimension: str | None = None

    def named(self, problem: str) -> str:
        """``problem`` (of ranks by their places), saying which group it happened in."""
        if self.dimension is None:
            return problem
        members = list(self.members)
        return f"{problem} [over {self.dimension!r}, in the group of global ranks {members}]"


def _renumbered(outcome: Outcome, members: tuple[int, ...]) -> Outcome:
    # Errors name global ranks; the example numbers the group's ranks by their places.
    error = outcome.error
    if error is None:
        return outcome
    place = {rank: index for index, rank in enumerate(members)}
    return attrs.evolve(
        outcome,
        error=attrs.evolve(
            error,
            calls=None
            if error.calls is None
            else tuple((place.get(rank, rank), call) for rank, call in error.calls),
            missing_ranks=None
            if error.missing_ranks is None
            else tuple(place.get(rank, rank) for rank in error.missing_ranks),
        ),
    )


@attrs.frozen
class MeshDimension:
    """A pool's ranks in the groups along one dimension of its strategy's mesh.

    It runs an example as `RankPool` does, with the group's size as the world size:
    every group of the dimension runs it at once, each rank at its place in its
    group, every collective called with ``group=dimension``; each group's outcomes
    are judged on their own. ``src`` and the rows of ``all_gather`` are places in the
    group (a rank passes the global rank at that place); errors name global ranks,
    which `run_groups` turns into places. Made by `RankPool.along`.
    """

    pool: RankPool
    dimension: str

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """The groups along the dimension, each its global ranks in order."""
        assert self.pool.layout is not None
        return self.pool.layout.groups(self.dimension)

    @property
    def world_size(self) -> int:
        """The size of each group: the world of the examples."""
        return len(self.groups[0])

    @property
    def target(self) -> StrategyTarget:
        """The pool's strategy."""
        return self.pool.target

    @property
    def backend(self) -> str:
        """The pool's lane."""
        return self.pool.backend

    @property
    def where(self) -> str:
        """The lane and the dimension in words, as a failure's headline names them."""
        groups = " and ".join(str(list(group)) for group in self.groups)
        return f"{self.pool.where}, over {self.dimension!r}: groups {groups}"

    @property
    def rerun(self) -> dict[str, object]:
        """The keyword arguments of `plait.conformance.reproduce` that rebuild this lane."""
        return {**self.pool.rerun, "dimension": self.dimension}

    def prepare(self, case: Case) -> Case:
        """``case`` as the groups run it, as its kind says (`ExampleKind.for_group`).

        A bad ``src`` meant to be outside the group is made one outside the job, say:
        a global rank past the group's size may be a member of another group.
        """
        return EXAMPLE_KINDS.kind_of(case).for_group(
            case, group_size=self.world_size, world_size=self.pool.world_size
        )

    def run_groups(self, case: Case, *, slower: float = 1.0) -> list[GroupOutcomes]:
        """Run ``case`` (as `prepare` made it) in every group at once.

        Returns:
            Each group's outcomes, renumbered.

        Raises:
            RankHangError, RankCrashError, PoolStartError: As `RankPool.run`.
        """
        outcomes = self.pool.run(
            case, dimension=self.dimension, deadline=self.pool.deadline * slower
        )
        devices = self.pool.devices
        return [
            GroupOutcomes(
                group,
                [_renumbered(outcomes[rank], group) for rank in group],
                tuple(devices[rank] for rank in group),
                self.dimension,
            )
            for group in self.groups
        ]

    def restart(self) -> None:
        """Restart the pool's ranks."""
        self.pool.restart()
