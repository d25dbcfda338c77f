"""What a declared semantics says a run must give, computed in one process.

`reference` trains the example's run as the declaration says the strategy does: one
model on the global batch (`Synchronous`), or one replica per rank, each on its own
micro-batches with its own optimizer, meeting through an outer SGD step every
``every`` steps and at the end (`PeriodicAveraging`). The replicas example's judge
compares the ranks' reports with it and says the first difference
(`plait.conformance.training.replicas.check_replicas`); the judging every example
shares (`check_training`, `reports`) is in `plait.conformance.training.example`.

An example may magnify the rounding of a sum taken in another order past any fixed
tolerance. Seen: with LBFGS, whose two-loop recursion divides by differences of
gradients, a transformer whose module after four steps moves by 2e-3 when its window's
gradients are summed micro-batch by micro-batch instead of at once, and an embedding in
``bf16-mixed`` whose second step moves a weight by 5.6 when they are summed rank by
rank, as data-parallel strategies sum them; with Adam, which makes a whole step of a
gradient that is nothing but rounding, BatchNorm over 2-sample micro-batches on 3 ranks
whose second step moves a weight by 3e-5 summed rank by rank. Where an example misses
the fixed tolerance, the reference is computed in each of the `ORDERS` too (and with
its gradients nudged), and the values (parameters, buffers, the exported module, the
losses) may differ by the precision's tolerance plus three times the largest gap
between them: how far this example carries rounding alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final, Literal

import attrs
import torch

from plait.conformance.lanes import RANK_THREADS
from plait.conformance.training.example import check_training, reports
from plait.conformance.training.models import (
    global_batch,
    make_model,
    make_optimizer,
    make_scheduler,
    rank_rows,
    step_scheduler,
)
from plait.core import PeriodicAveraging, Synchronous

if TYPE_CHECKING:
    from collections.abc import Sequence

    from plait.conformance.training.cases import TrainingRun
    from plait.core import Replicas
    from plait.core.training import Buffers, OuterOptimizer, OuterScheduler

__all__ = [
    "ORDERS",
    "Meetings",
    "Order",
    "RankBuffers",
    "Reference",
    "check_training",
    "describe",
    "flat_buffers",
    "meetings_reference",
    "reference",
    "reports",
    "resized_reference",
]

Order = Literal["at once", "micro-batch by micro-batch", "rank by rank"]
"""How the reference sums a window's gradients: the whole window at once, each
micro-batch in turn, or each rank's window in turn and then their mean (the order of a
data-parallel strategy)."""

ORDERS: Final[tuple[Order, ...]] = ("micro-batch by micro-batch", "rank by rank")
"""The orders besides "at once" in which an example's rounding is measured."""

NUDGED_RUNS: Final = 4
"""How many runs, besides those in other `ORDERS`, measure an example's rounding:
each with every gradient it steps from nudged at random by one unit in its last place.
LBFGS divides by differences of gradients; where they are small, a rounding apart is
magnified by a factor the other orders alone may underestimate tenfold."""


@attrs.frozen(hash=False)  # it holds tensors
class Reference:
    """A run as its declared semantics says it must go.

    Attributes:
        losses: The global loss of each step.
        replicas: After each step (and after the end of training), each rank's
            parameters, flattened.
        final: The trained module's state (the one every replica ends as).
    """

    losses: tuple[float, ...]
    replicas: tuple[tuple[torch.Tensor, ...], ...]
    final: dict[str, torch.Tensor]
    anchors: tuple[torch.Tensor, ...] = ()
    """After each step (and after the end of training), the last meeting's module,
    flattened (synchronous replicas: the module)."""
    spread: tuple[float, ...] = ()
    """After each step (and the end), how far the example carries rounding alone: the
    largest gap between the reference and the same run with its gradients summed in
    one of the other `ORDERS` or nudged (empty where not measured)."""
    loss_spread: tuple[float, ...] = ()
    """The same for the loss of each step."""
    buffers: tuple[torch.Tensor, ...] = ()
    """After the end of training, each rank's buffers (BatchNorm's running
    statistics), flattened; empty tensors for a model without buffers."""
    buffer_spread: tuple[float, ...] = ()
    """The same as ``spread`` for each rank's ``buffers``."""
    final_spread: dict[str, float] = attrs.field(factory=dict)
    """The same as ``spread`` for each entry of ``final``."""

    def rounding(self, index: int, *, loss: bool = False) -> float:
        """The ``spread`` after step ``index`` (the last: after the end); 0 if not measured.

        With ``loss``, the ``loss_spread`` of step ``index``.
        """
        measured = self.loss_spread if loss else self.spread
        return measured[index] if measured else 0.0

    def buffer_rounding(self, rank: int) -> float:
        """The ``buffer_spread`` of rank ``rank``'s buffers; 0 if not measured."""
        return self.buffer_spread[rank] if self.buffer_spread else 0.0

    def final_rounding(self, name: str) -> float:
        """The ``final_spread`` of the exported module's ``name``; 0 if not measured."""
        return self.final_spread.get(name, 0.0)

    def measured_as(self, other: Reference) -> Reference:
        """This reference, judged within the rounding ``other`` measured."""
        return attrs.evolve(
            self,
            spread=other.spread,
            loss_spread=other.loss_spread,
            buffer_spread=other.buffer_spread,
            final_spread=other.final_spread,
        )


def describe(replicas: Replicas, world_size: int) -> str:
    """The reference of ``replicas`` in words, as a failure names it."""
    if isinstance(replicas, Synchronous):
        ranks = "the one rank" if world_size == 1 else f"the {world_size} ranks"
        return f"one process on the global batch of {ranks} (Synchronous)"
    outer = (
        ""
        if replicas.outer_lr == 1 and not replicas.outer_momentum
        else f", outer SGD lr={replicas.outer_lr} momentum={replicas.outer_momentum}"
        + (" nesterov" if replicas.nesterov else "")
    )
    if replicas.outer_optimizer is not None:
        outer = f", outer optimizer {_name(replicas.outer_optimizer)}" + (
            f" scheduled by {_name(replicas.outer_scheduler)}"
            if replicas.outer_scheduler is not None
            else ""
        )
    return (
        f"{world_size} replicas, each on its own data, meeting every {replicas.every} "
        f"steps and at the end (PeriodicAveraging{outer})"
    )


def _name(factory: object) -> str:
    return str(getattr(factory, "__qualname__", None) or repr(factory))


@contextlib.contextmanager
def _precision(run: TrainingRun) -> Iterator[None]:
    if "bf16" in run.precision:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield
    elif run.precision.startswith("16"):
        with torch.autocast("cpu", dtype=torch.float16):
            yield
    else:
        yield


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([parameter.detach().float().reshape(-1) for parameter in model.parameters()])


def _buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    return [buffer.detach().clone() for buffer in model.buffers()]


def flat_buffers(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """Buffers flattened into one float64 vector (counts included)."""
    if not values:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat([value.double().reshape(-1) for value in values])


class RankBuffers:
    """Each rank's buffers for one process's model, as a declaration says they go.

    One model holds the replicas' parameters (synchronous replicas are one module);
    its buffers are swapped in for each rank's micro-batches, and at the start of a
    window they are rank 0's everywhere where the strategy broadcasts them.
    """

    def __init__(self, model: torch.nn.Module, world_size: int, updates: Buffers) -> None:
        self.model = model
        self.updates = updates
        # Each rank's buffers are put in as tensors of their own, never written over:
        # a window's backward still reads those its forward ran with.
        self.slots = [
            (module, name)
            for module in model.modules()
            for name, _ in module.named_buffers(recurse=False)
        ]
        first = _buffers(model)
        self.held = [[value.clone() for value in first] for _ in range(world_size)]

    def start_window(self) -> None:
        """A window of an optimizer step (a closure's call) begins."""
        if self.updates == "broadcast":
            self.held = [[value.clone() for value in self.held[0]] for _ in self.held]

    def _put(self, values: Sequence[torch.Tensor]) -> None:
        for (module, name), value in zip(self.slots, values, strict=True):
            setattr(module, name, value.clone())

    @contextlib.contextmanager
    def of(self, rank: int) -> Iterator[None]:
        """Inside, the model holds rank ``rank``'s buffers; what it does to them is kept."""
        self._put(self.held[rank])
        yield
        self.held[rank] = [getattr(module, name).detach().clone() for module, name in self.slots]

    def load(self, world_size: int) -> None:
        """Every rank (of ``world_size``) loads a checkpoint: rank 0's buffers."""
        self.held = [[value.clone() for value in self.held[0]] for _ in range(world_size)]

    def end(self) -> tuple[torch.Tensor, ...]:
        """Each rank's buffers, flattened; the model left with rank 0's (its export)."""
        self._put(self.held[0])
        return tuple(flat_buffers(values) for values in self.held)


class _Replica:
    def __init__(self, run: TrainingRun) -> None:
        self.model = make_model(run)
        self.optimizer = make_optimizer(run, self.model.parameters())
        self.scheduler = make_scheduler(run, self.optimizer)


def _window_loss(
    run: TrainingRun,
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    ranks: int,
    *,
    buffers: RankBuffers | None = None,
    owners: Sequence[int] = (),
) -> torch.Tensor:
    """The mean over ``ranks`` ranks of their window losses (micro-batches over ``accumulate``).

    ``owners``: the rank of each micro-batch, whose buffers it runs with.
    """
    total = torch.zeros(())
    for index, start in enumerate(range(0, len(inputs), run.micro_batch)):
        held = buffers.of(owners[index]) if buffers is not None else contextlib.nullcontext()
        with held, _precision(run):
            output = model(inputs[start : start + run.micro_batch])
        loss = torch.nn.functional.cross_entropy(
            output.float(), targets[start : start + run.micro_batch]
        )
        total = total + loss / (run.accumulate * ranks)
    return total


def _rank_samples(
    run: TrainingRun, world_size: int, rank: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = global_batch(run, world_size, step)
    rows = rank_rows(run, world_size, rank)
    return inputs[rows], targets[rows]


def _backward(
    run: TrainingRun,
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    ranks: int,
    *,
    order: Order,
    buffers: RankBuffers | None = None,
) -> float:
    """The window's gradients, summed in ``order``: its loss.

    The window's micro-batches are in the global batch's order, window by window and
    rank by rank in each (`plait.conformance.training.models.rank_rows`).
    """
    if buffers is not None:
        buffers.start_window()
    owners = [index % ranks for index in range(len(inputs) // run.micro_batch)]
    if order == "rank by rank" and ranks > 1:
        return _backward_by_rank(run, model, inputs, targets, ranks, buffers=buffers)
    if order != "micro-batch by micro-batch":
        loss = _window_loss(run, model, inputs, targets, ranks, buffers=buffers, owners=owners)
        torch.autograd.backward(loss)
        return float(loss.detach())
    total = 0.0
    for index, start in enumerate(range(0, len(inputs), run.micro_batch)):
        part = _window_loss(
            run,
            model,
            inputs[start : start + run.micro_batch],
            targets[start : start + run.micro_batch],
            ranks,
            buffers=buffers,
            owners=owners[index : index + 1],
        )
        torch.autograd.backward(part)
        total += float(part.detach())
    return total


def _backward_by_rank(
    run: TrainingRun,
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    ranks: int,
    *,
    buffers: RankBuffers | None,
) -> float:
    """Each rank's window gradients in turn, then their mean (gradients start cleared)."""
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    sums: list[torch.Tensor | None] = [None] * len(parameters)
    total = 0.0
    for rank in range(ranks):
        rows = rank_rows(run, ranks, rank)
        for parameter in parameters:
            parameter.grad = None
        part = _window_loss(
            run,
            model,
            inputs[rows],
            targets[rows],
            1,
            buffers=buffers,
            owners=[rank] * run.accumulate,
        )
        torch.autograd.backward(part)
        total += float(part.detach())
        for index, parameter in enumerate(parameters):
            grad, held = parameter.grad, sums[index]
            if grad is not None:
                sums[index] = grad if held is None else held + grad
    for parameter, held in zip(parameters, sums, strict=True):
        parameter.grad = None if held is None else held / ranks
    return total / ranks


def _step(
    run: TrainingRun,
    replica: _Replica,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    ranks: int,
    *,
    order: Order = "at once",
    buffers: RankBuffers | None = None,
    nudges: torch.Generator | None = None,
) -> float:
    """One optimizer step of ``replica`` on ``inputs``: the loss it reports.

    With ``nudges``, each gradient the optimizer steps from is nudged (`_nudge`).
    """
    optimizer = replica.optimizer
    if run.optimizer == "lbfgs":
        first: list[float] = []

        def closure() -> float:
            optimizer.zero_grad()
            loss = _backward(
                run, replica.model, inputs, targets, ranks, order=order, buffers=buffers
            )
            if nudges is not None:
                _nudge(replica.model, nudges)
            if not first:
                first.append(loss)
            return loss

        optimizer.step(closure)
        optimizer.zero_grad()
        return first[0]
    loss = _backward(run, replica.model, inputs, targets, ranks, order=order, buffers=buffers)
    if nudges is not None:
        _nudge(replica.model, nudges)
    optimizer.step()
    optimizer.zero_grad()
    return loss


def _nudge(model: torch.nn.Module, nudges: torch.Generator) -> None:
    """Move each element of each gradient one unit in its last place up or down, or not.

    Which, at random from ``nudges``: a rounding of the size a sum taken in another
    order (or a collective's) leaves.
    """
    for parameter in model.parameters():
        grad = parameter.grad
        if grad is None:
            continue
        way = torch.randint(-1, 2, grad.shape, generator=nudges).to(grad.device)
        up = torch.nextafter(grad, torch.full_like(grad, float("inf")))
        down = torch.nextafter(grad, torch.full_like(grad, float("-inf")))
        grad.copy_(torch.where(way > 0, up, torch.where(way < 0, down, grad)))


def reference(
    run: TrainingRun,
    world_size: int,
    replicas: Replicas,
    *,
    rounding: bool = False,
    buffers: Buffers = "broadcast",
) -> Reference:
    """``run`` at ``world_size`` as ``replicas`` says a strategy trains it.

    With ``rounding``, also how far the example carries rounding (`Reference.spread`
    and the buffers', the export's and the losses' alike: the run is computed again in
    each of the other `ORDERS`, and `NUDGED_RUNS` times with its gradients nudged by a
    rounding, from the run's seed).
    ``buffers`` says what becomes of synchronous replicas' buffers
    (`plait.core.TrainingSemantics.buffers`); replicas on their own keep their own.
    """
    expected = _reference(run, world_size, replicas, order="at once", buffers=buffers)
    if not rounding:
        return expected
    # Replicas on their own data (and one rank) sum rank by rank as they sum at once.
    by_rank = isinstance(replicas, Synchronous) and world_size > 1
    others = [
        _reference(run, world_size, replicas, order=order, buffers=buffers)
        for order in ORDERS
        if by_rank or order != "rank by rank"
    ]
    others += [
        _reference(
            run,
            world_size,
            replicas,
            order="at once",
            buffers=buffers,
            nudges=_nudge_generator(run, index),
        )
        for index in range(NUDGED_RUNS)
    ]
    spread = tuple(
        max(_gap(mine, other.replicas[step]) for other in others)
        for step, mine in enumerate(expected.replicas)
    )
    loss_spread = tuple(
        max(abs(mine - other.losses[step]) for other in others)
        for step, mine in enumerate(expected.losses)
    )
    buffer_spread = tuple(
        max(_gap((mine,), (other.buffers[rank],)) for other in others)
        for rank, mine in enumerate(expected.buffers)
    )
    final_spread = {
        name: max(_gap((mine,), (other.final[name],)) for other in others)
        for name, mine in expected.final.items()
    }
    return attrs.evolve(
        expected,
        spread=spread,
        loss_spread=loss_spread,
        buffer_spread=buffer_spread,
        final_spread=final_spread,
    )


def _nudge_generator(run: TrainingRun, index: int) -> torch.Generator:
    """The generator of the ``index``-th of the run's `NUDGED_RUNS`, from its seed."""
    return torch.Generator().manual_seed(run.seed * NUDGED_RUNS + index)


def _gap(mine: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> float:
    """The largest difference between two runs' replicas after one step."""
    return max(
        float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        for a, b in zip(mine, theirs, strict=True)
    )


@contextlib.contextmanager
def _as_the_ranks() -> Iterator[None]:
    """Compute as a pool's rank does, on its intra-op threads (`RANK_THREADS`).

    A kernel then sums in the order it sums there. The caller's random state and
    thread count are its own again afterwards.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(RANK_THREADS)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)


def _reference(
    run: TrainingRun,
    world_size: int,
    replicas: Replicas,
    *,
    order: Order,
    buffers: Buffers = "broadcast",
    nudges: torch.Generator | None = None,
) -> Reference:
    with _as_the_ranks():
        if isinstance(replicas, Synchronous):
            return _synchronous(run, world_size, order=order, buffers=buffers, nudges=nudges)
        return _periodic(run, world_size, replicas, order=order, nudges=nudges)


def resized_reference(run: TrainingRun, world_size: int, moved_to: int, at: int) -> Reference:
    """``run`` of synchronous replicas saved after ``at`` steps and resumed at ``moved_to`` ranks.

    One process on each step's global batch: ``world_size`` ranks' before the move,
    ``moved_to`` ranks' from it on (where every rank loads rank 0's buffers).
    """
    with _as_the_ranks():
        return _synchronous(run, world_size, order="at once", moved=(moved_to, at))


def _synchronous(
    run: TrainingRun,
    world_size: int,
    *,
    order: Order,
    moved: tuple[int, int] | None = None,
    buffers: Buffers = "broadcast",
    nudges: torch.Generator | None = None,
) -> Reference:
    replica = _Replica(run)
    ranks = RankBuffers(replica.model, world_size, buffers)
    losses: list[float] = []
    after: list[tuple[torch.Tensor, ...]] = []
    epoch: list[float] = []
    for step in range(run.steps):
        if moved is not None and step == moved[1]:
            world_size = moved[0]
            ranks.load(world_size)
        inputs, targets = global_batch(run, world_size, step)
        losses.append(
            _step(
                run, replica, inputs, targets, world_size, order=order, buffers=ranks, nudges=nudges
            )
        )
        if step % run.steps_per_epoch == 0:
            epoch = []
        epoch.append(losses[-1])
        step_scheduler(run, replica.scheduler, step, epoch)
        after.append((_flat(replica.model),) * world_size)
    after.append((_flat(replica.model),) * world_size)
    held = ranks.end()
    final = {name: value.detach().clone() for name, value in replica.model.state_dict().items()}
    return Reference(
        tuple(losses), tuple(after), final, anchors=tuple(one[0] for one in after), buffers=held
    )


@attrs.frozen
class Meetings:
    """How replicas that each train on their own data meet: as declared, or as a flaw would.

    Attributes:
        every: The steps between meetings; None: they never meet while training.
        outer_lr: The outer SGD step's learning rate.
        outer_momentum: Its momentum (0 for none).
        nesterov: Whether its momentum is Nesterov's.
        at_end: Whether they meet at the end of training, over what is left of a period.
        sign: 1, or -1 where the outer step goes the other way (``anchor + lr * update``).
        outer_optimizer: The factory of the outer optimizer, in place of the outer SGD.
        outer_scheduler: The factory of its scheduler.
        fresh_outer: Whether the outer optimizer (and scheduler) is made anew at each
            meeting, its state lost.
        fragments: The fragments whose meetings are staggered over the period.
        periods: Each parameter group's own period (`PeriodicAveraging.periods`).
    """

    every: int | None
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    nesterov: bool = False
    at_end: bool = True
    sign: float = 1.0
    outer_optimizer: OuterOptimizer | None = None
    outer_scheduler: OuterScheduler | None = None
    fresh_outer: bool = False
    fragments: int = 1
    periods: tuple[int, ...] = ()

    @property
    def parts(self) -> int:
        """How many parts the parameters meet in (`PeriodicAveraging.parts`)."""
        return len(self.periods) or self.fragments

    def meets(self, fragment: int, steps: int) -> bool:
        """Whether ``fragment`` meets once ``steps`` steps are taken (as `PeriodicAveraging`)."""
        if self.every is None:
            return False
        if self.periods:
            return steps > 0 and steps % self.periods[fragment] == 0
        return steps > 0 and steps % self.every == fragment * self.every // self.fragments

    @classmethod
    def of(cls, averaging: PeriodicAveraging) -> Meetings:
        """The meetings ``averaging`` declares."""
        return cls(
            averaging.every,
            averaging.outer_lr,
            averaging.outer_momentum,
            averaging.nesterov,
            outer_optimizer=averaging.outer_optimizer,
            outer_scheduler=averaging.outer_scheduler,
            fragments=averaging.fragments,
            periods=averaging.periods,
        )


class _Outer:
    """The outer step of a declared outer optimizer, over the anchor's tensors."""

    def __init__(self, meetings: Meetings, anchor: list[torch.Tensor]) -> None:
        assert meetings.outer_optimizer is not None
        self.meetings = meetings
        self.parameters = [torch.nn.Parameter(point) for point in anchor]
        self.optimizer, self.scheduler = self._make()

    def _make(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None]:
        make, schedule = self.meetings.outer_optimizer, self.meetings.outer_scheduler
        assert make is not None
        optimizer = make(self.parameters)
        return optimizer, schedule(optimizer) if schedule is not None else None

    def step(self, means: dict[int, torch.Tensor]) -> None:
        """The anchor's parameters in ``means`` take the outer step toward them (in place)."""
        if self.meetings.fresh_outer:
            self.optimizer, self.scheduler = self._make()
        for index, parameter in enumerate(self.parameters):
            mean = means.get(index)
            parameter.grad = (
                None if mean is None else self.meetings.sign * (parameter.detach() - mean)
            )
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.scheduler is not None:
            self.scheduler.step()


def meetings_reference(run: TrainingRun, world_size: int, meetings: Meetings) -> Reference:
    """``run`` at ``world_size`` with replicas on their own data meeting as ``meetings`` says."""
    with _as_the_ranks():
        return _periodic(run, world_size, meetings, order="at once")


def _periodic(
    run: TrainingRun,
    world_size: int,
    replicas: PeriodicAveraging | Meetings,
    *,
    order: Order,
    nudges: torch.Generator | None = None,
) -> Reference:
    meetings = Meetings.of(replicas) if isinstance(replicas, PeriodicAveraging) else replicas
    models = [_Replica(run) for _ in range(world_size)]
    anchor: list[torch.Tensor] = [
        parameter.detach().clone() for parameter in models[0].model.parameters()
    ]
    outer = _Outer(meetings, anchor) if meetings.outer_optimizer is not None else None
    momentum: dict[int, torch.Tensor] = {}
    losses: list[float] = []
    after: list[tuple[torch.Tensor, ...]] = []
    anchors: list[torch.Tensor] = []
    epoch: list[float] = []

    count = len(anchor)
    fragment_of = [index * meetings.parts // count for index in range(count)]
    replica_parameters = [list(replica.model.parameters()) for replica in models]

    def meet(fragments: set[int]) -> None:
        """The parameters of ``fragments`` meet: the outer step over them alone."""
        indices = [index for index in range(count) if fragment_of[index] in fragments]
        if not indices:
            return
        means = {
            index: torch.stack([own[index].detach() for own in replica_parameters]).mean(dim=0)
            for index in indices
        }
        if outer is not None:
            outer.step(means)
            with torch.no_grad():
                for index in indices:
                    stepped = outer.parameters[index]
                    anchor[index] = stepped.detach()
                    for own in replica_parameters:
                        own[index].copy_(stepped)
            return
        with torch.no_grad():
            for index in indices:
                point = anchor[index]
                update = point - means[index]
                if meetings.outer_momentum:
                    held = momentum.get(index)
                    buffer = (
                        update.clone() if held is None else held * meetings.outer_momentum + update
                    )
                    momentum[index] = buffer
                    update = (
                        update + meetings.outer_momentum * buffer if meetings.nesterov else buffer
                    )
                point.sub_(meetings.sign * meetings.outer_lr * update)
                for own in replica_parameters:
                    own[index].copy_(point)

    for step in range(run.steps):
        step_losses = []
        for rank, replica in enumerate(models):
            inputs, targets = _rank_samples(run, world_size, rank, step)
            step_losses.append(_step(run, replica, inputs, targets, 1, order=order, nudges=nudges))
        loss = sum(step_losses) / world_size
        losses.append(loss)
        if step % run.steps_per_epoch == 0:
            epoch = []
        epoch.append(loss)
        for replica in models:
            step_scheduler(run, replica.scheduler, step, epoch)
        meet({k for k in range(meetings.parts) if meetings.meets(k, step + 1)})
        after.append(tuple(_flat(replica.model) for replica in models))
        anchors.append(torch.cat([point.reshape(-1).float() for point in anchor]))
    if meetings.at_end:
        meet({k for k in range(meetings.parts) if not meetings.meets(k, run.steps)})
    after.append(tuple(_flat(replica.model) for replica in models))
    anchors.append(torch.cat([point.reshape(-1).float() for point in anchor]))
    final = {name: value.detach().clone() for name, value in models[0].model.state_dict().items()}
    return Reference(
        tuple(losses),
        tuple(after),
        final,
        anchors=tuple(anchors),
        buffers=tuple(flat_buffers(_buffers(replica.model)) for replica in models),
    )
