"""What a declared semantics says a run must give, computed in one process, and the judges.

`reference` trains the example's run as the declaration says the strategy does: one
model on the global batch (`Synchronous`), or one replica per rank, each on its own
micro-batches with its own optimizer, meeting through an outer SGD step every
``every`` steps and at the end (`PeriodicAveraging`). The judges compare the ranks'
reports with it, and say the first difference.

With LBFGS, whose two-loop recursion divides by differences of gradients, an example
may magnify the rounding of a sum taken in another order past any fixed tolerance
(seen: a transformer whose module after four steps moves by 2e-3 when its window's
gradients are summed micro-batch by micro-batch instead of at once). Where an LBFGS
example misses the fixed tolerance, the reference is computed both ways, and the
values may differ by the precision's tolerance plus three times the gap between the
two: how far this example carries rounding alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import attrs
import torch

from plait.conformance.outcomes import rank_list
from plait.conformance.training.compare import tolerance
from plait.conformance.training.loop import TrainingReport
from plait.conformance.training.models import (
    global_batch,
    make_model,
    make_optimizer,
    make_scheduler,
    step_scheduler,
)
from plait.core import PeriodicAveraging, Synchronous, TrainingSemantics

if TYPE_CHECKING:
    from plait.conformance.outcomes import Outcome
    from plait.conformance.training.cases import TrainingCase, TrainingRun
    from plait.core import Replicas

__all__ = ["Reference", "check_training", "describe", "reference", "reports"]


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
    spread: tuple[float, ...] = ()
    """After each step (and the end), how far the example carries rounding alone: the
    largest gap between the reference and the same run with its gradients summed in
    another order (LBFGS only; empty otherwise)."""
    loss_spread: tuple[float, ...] = ()
    """The same for the loss of each step."""

    def rounding(self, index: int, *, loss: bool = False) -> float:
        """The ``spread`` after step ``index`` (the last: after the end); 0 if not measured.

        With ``loss``, the ``loss_spread`` of step ``index``.
        """
        measured = self.loss_spread if loss else self.spread
        return measured[index] if measured else 0.0


def describe(replicas: Replicas, world_size: int) -> str:
    """The reference of ``replicas`` in words, as a failure names it."""
    if isinstance(replicas, Synchronous):
        return f"one process on the global batch of the {world_size} ranks (Synchronous)"
    outer = (
        ""
        if replicas.outer_lr == 1 and not replicas.outer_momentum
        else f", outer SGD lr={replicas.outer_lr} momentum={replicas.outer_momentum}"
        + (" nesterov" if replicas.nesterov else "")
    )
    return (
        f"{world_size} replicas, each on its own data, meeting every {replicas.every} "
        f"steps and at the end (PeriodicAveraging{outer})"
    )


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
) -> torch.Tensor:
    """The mean over ``ranks`` ranks of their window losses (micro-batches over ``accumulate``)."""
    total = torch.zeros(())
    for start in range(0, len(inputs), run.micro_batch):
        with _precision(run):
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
    rows = [
        index
        for window in range(run.accumulate)
        for index in range(
            (window * world_size + rank) * run.micro_batch,
            (window * world_size + rank + 1) * run.micro_batch,
        )
    ]
    return inputs[rows], targets[rows]


def _backward(
    run: TrainingRun,
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    ranks: int,
    *,
    by_micro_batch: bool,
) -> float:
    """The window's gradients (summed at once, or micro-batch by micro-batch): its loss."""
    if not by_micro_batch:
        loss = _window_loss(run, model, inputs, targets, ranks)
        torch.autograd.backward(loss)
        return float(loss.detach())
    total = 0.0
    for start in range(0, len(inputs), run.micro_batch):
        part = _window_loss(
            run,
            model,
            inputs[start : start + run.micro_batch],
            targets[start : start + run.micro_batch],
            ranks,
        )
        torch.autograd.backward(part)
        total += float(part.detach())
    return total


def _step(
    run: TrainingRun,
    replica: _Replica,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    ranks: int,
    *,
    by_micro_batch: bool = False,
) -> float:
    """One optimizer step of ``replica`` on ``inputs``: the loss it reports."""
    optimizer = replica.optimizer
    if run.optimizer == "lbfgs":
        first: list[float] = []

        def closure() -> float:
            optimizer.zero_grad()
            loss = _backward(
                run, replica.model, inputs, targets, ranks, by_micro_batch=by_micro_batch
            )
            if not first:
                first.append(loss)
            return loss

        optimizer.step(closure)
        optimizer.zero_grad()
        return first[0]
    loss = _backward(run, replica.model, inputs, targets, ranks, by_micro_batch=by_micro_batch)
    optimizer.step()
    optimizer.zero_grad()
    return loss


def reference(
    run: TrainingRun, world_size: int, replicas: Replicas, *, rounding: bool = False
) -> Reference:
    """``run`` at ``world_size`` as ``replicas`` says a strategy trains it.

    With ``rounding`` and LBFGS, also how far the example carries rounding
    (`Reference.spread`: the run is computed a second time).
    """
    expected = _reference(run, world_size, replicas, by_micro_batch=False)
    if not rounding or run.optimizer != "lbfgs":
        return expected
    other = _reference(run, world_size, replicas, by_micro_batch=True)
    spread = tuple(
        max(float((a.double() - b.double()).abs().max()) if a.numel() else 0.0 for a, b in pairs)
        for pairs in (
            zip(mine, theirs, strict=True)
            for mine, theirs in zip(expected.replicas, other.replicas, strict=True)
        )
    )
    loss_spread = tuple(
        abs(mine - theirs) for mine, theirs in zip(expected.losses, other.losses, strict=True)
    )
    return attrs.evolve(expected, spread=spread, loss_spread=loss_spread)


def _reference(
    run: TrainingRun, world_size: int, replicas: Replicas, *, by_micro_batch: bool
) -> Reference:
    with torch.random.fork_rng(devices=[]):
        if isinstance(replicas, Synchronous):
            return _synchronous(run, world_size, by_micro_batch=by_micro_batch)
        return _periodic(run, world_size, replicas, by_micro_batch=by_micro_batch)


def _synchronous(run: TrainingRun, world_size: int, *, by_micro_batch: bool) -> Reference:
    replica = _Replica(run)
    losses: list[float] = []
    after: list[tuple[torch.Tensor, ...]] = []
    epoch: list[float] = []
    for step in range(run.steps):
        inputs, targets = global_batch(run, world_size, step)
        losses.append(
            _step(run, replica, inputs, targets, world_size, by_micro_batch=by_micro_batch)
        )
        if step % run.steps_per_epoch == 0:
            epoch = []
        epoch.append(losses[-1])
        step_scheduler(run, replica.scheduler, step, epoch)
        after.append((_flat(replica.model),) * world_size)
    after.append((_flat(replica.model),) * world_size)
    final = {name: value.detach().clone() for name, value in replica.model.state_dict().items()}
    return Reference(tuple(losses), tuple(after), final)


def _periodic(
    run: TrainingRun, world_size: int, replicas: PeriodicAveraging, *, by_micro_batch: bool
) -> Reference:
    models = [_Replica(run) for _ in range(world_size)]
    anchor = [parameter.detach().clone() for parameter in models[0].model.parameters()]
    momentum: list[torch.Tensor] | None = None
    losses: list[float] = []
    after: list[tuple[torch.Tensor, ...]] = []
    epoch: list[float] = []

    def meet() -> None:
        nonlocal momentum
        with torch.no_grad():
            new_momentum = []
            for index, point in enumerate(anchor):
                mean = torch.stack(
                    [list(replica.model.parameters())[index].detach() for replica in models]
                ).mean(dim=0)
                update = point - mean
                if replicas.outer_momentum:
                    buffer = (
                        update.clone()
                        if momentum is None
                        else momentum[index] * replicas.outer_momentum + update
                    )
                    new_momentum.append(buffer)
                    update = (
                        update + replicas.outer_momentum * buffer if replicas.nesterov else buffer
                    )
                point.sub_(replicas.outer_lr * update)
                for replica in models:
                    list(replica.model.parameters())[index].copy_(point)
            if replicas.outer_momentum:
                momentum = new_momentum

    for step in range(run.steps):
        step_losses = []
        for rank, replica in enumerate(models):
            inputs, targets = _rank_samples(run, world_size, rank, step)
            step_losses.append(
                _step(run, replica, inputs, targets, 1, by_micro_batch=by_micro_batch)
            )
        loss = sum(step_losses) / world_size
        losses.append(loss)
        if step % run.steps_per_epoch == 0:
            epoch = []
        epoch.append(loss)
        for replica in models:
            step_scheduler(run, replica.scheduler, step, epoch)
        if (step + 1) % replicas.every == 0:
            meet()
        after.append(tuple(_flat(replica.model) for replica in models))
    if run.steps % replicas.every:
        meet()
    after.append(tuple(_flat(replica.model) for replica in models))
    final = {name: value.detach().clone() for name, value in models[0].model.state_dict().items()}
    return Reference(tuple(losses), tuple(after), final)


# Judging.


def reports(outcomes: Sequence[Outcome]) -> tuple[list[TrainingReport], list[str]]:
    """Each rank's report, and the problems of ranks that sent none or disagree on refusing."""
    found = [outcome.result for outcome in outcomes]
    problems = [
        f"rank {outcome.rank} sent {type(outcome.result).__name__}, not a training report"
        for outcome in outcomes
        if not isinstance(outcome.result, TrainingReport)
    ]
    kept = [report for report in found if isinstance(report, TrainingReport)]
    if problems:
        return kept, problems
    refused = [index for index, report in enumerate(kept) if report.refused is not None]
    if refused and len(refused) != len(kept):
        others = [index for index in range(len(kept)) if index not in refused]
        problems.append(
            f"{rank_list(refused)} refused the example's settings and {rank_list(others)} "
            f"took them: {kept[refused[0]].refused}"
        )
    return kept, problems


def _close(
    found: torch.Tensor, expected: torch.Tensor, run: TrainingRun, rounding: float = 0.0
) -> bool:
    """Within the precision's tolerance, plus three times the example's own ``rounding``."""
    rtol, atol = tolerance(run.precision, run.optimizer)
    return found.shape == expected.shape and torch.allclose(
        found.double(), expected.double(), rtol=rtol, atol=atol + 3 * rounding
    )


def _largest(found: torch.Tensor, expected: torch.Tensor) -> str:
    if found.shape != expected.shape:
        return f"{found.numel()} values where the reference has {expected.numel()}"
    gap = (found.double() - expected.double()).abs()
    index = int(gap.argmax())
    return (
        f"at flat index {index}: {found.reshape(-1)[index].item():.6g}, the reference "
        f"{expected.reshape(-1)[index].item():.6g} (largest gap {gap.max().item():.3g})"
    )


def check_training(case: TrainingCase, outcomes: Sequence[Outcome]) -> list[str]:
    """How the ranks' reports of ``case`` break the declared semantics; empty if they keep it."""
    kept, problems = reports(outcomes)
    if problems or not kept or kept[0].refused is not None:
        return problems
    for index, report in enumerate(kept):
        problems += [f"rank {index}: {problem}" for problem in report.problems]
    if problems or case.kind != "replicas":
        return problems
    return _check_replicas(case, kept)


def _check_replicas(case: TrainingCase, kept: list[TrainingReport]) -> list[str]:
    run, world_size = case.run, len(kept)
    semantics: TrainingSemantics = kept[0].semantics
    disagreeing = [index for index, report in enumerate(kept) if report.semantics != semantics]
    if disagreeing:
        return [
            (
                f"{rank_list(disagreeing)} declare other training semantics than rank 0: "
                f"{kept[disagreeing[0]].semantics} and {semantics}"
            )
        ]
    said = describe(semantics.replicas, world_size)
    expected = reference(run, world_size, semantics.replicas)
    problems = _judge(run, kept, expected, said)
    if problems and run.optimizer == "lbfgs":
        # Judged again within the rounding this example carries, measured only where
        # the fixed tolerance is not enough: a second reference run costs time.
        expected = reference(run, world_size, semantics.replicas, rounding=True)
        problems = _judge(run, kept, expected, said)
    return problems


def _judge(
    run: TrainingRun, kept: list[TrainingReport], expected: Reference, said: str
) -> list[str]:
    return (
        _check_losses(run, kept, expected, said)
        + _check_modules(run, kept, expected, said)
        + _check_export(run, kept[0].export, expected, said)
    )


def _check_losses(
    run: TrainingRun, kept: list[TrainingReport], expected: Reference, said: str
) -> list[str]:
    rtol, _ = tolerance(run.precision, run.optimizer)
    problems: list[str] = []
    for index, report in enumerate(kept):
        if len(report.losses) != len(expected.losses):
            problems.append(
                f"rank {index}: reported {len(report.losses)} losses for {run.steps} steps"
            )
            continue
        for step, (got, want) in enumerate(zip(report.losses, expected.losses, strict=True)):
            rounding = expected.rounding(step, loss=True)
            if abs(got - want) > rtol * max(1.0, abs(want)) * 10 + 3 * rounding:
                problems.append(
                    f"rank {index}: the loss of step {step} is {got:.6g}; {said} gives {want:.6g}"
                )
                break
    return problems


def _check_modules(
    run: TrainingRun, kept: list[TrainingReport], expected: Reference, said: str
) -> list[str]:
    problems: list[str] = []
    for index, report in enumerate(kept):
        for step, (got, want) in enumerate(
            zip(report.replicas or (), expected.replicas, strict=False)
        ):
            found = torch.tensor(got, dtype=torch.float64)
            if not _close(found, want[index], run, expected.rounding(step)):
                when = "after the end of training" if step == run.steps else f"after step {step}"
                problems.append(
                    f"rank {index}: its module {when} is not what {said} gives: "
                    f"{_largest(found, want[index])}"
                )
                break
    return problems


def _check_export(
    run: TrainingRun, export: dict[str, torch.Tensor] | None, expected: Reference, said: str
) -> list[str]:
    if export is None:
        return ["rank 0: export_checkpoint wrote nothing it could read back"]
    for name, want in expected.final.items():
        got = export.get(name)
        if got is None:
            return [f"the exported module has no {name!r}: it has {sorted(export)}"]
        if not _close(got.float(), want.float(), run, expected.rounding(run.steps)):
            return [
                (
                    f"the exported module's {name!r} is not the trained module {said} gives: "
                    f"{_largest(got.float(), want.float())}"
                )
            ]
    return []


def check_move(
    source: str, target: str, expected: Sequence[float], found: Sequence[float], run: TrainingRun
) -> list[str]:
    """How a checkpoint of ``source`` loaded by ``target`` failed to go on with its losses."""
    rtol, _ = tolerance(run.precision, run.optimizer)
    if len(found) != len(expected):
        return [f"{target} took {len(found)} steps from {source}'s checkpoint, not {len(expected)}"]
    for step, (got, want) in enumerate(zip(found, expected, strict=True)):
        if abs(got - want) > rtol * max(1.0, abs(want)) * 10:
            return [
                (
                    f"{target}, going on from {source}'s checkpoint, has the loss {got:.6g} at its "
                    f"step {step}; {source} itself went on with {want:.6g}"
                )
            ]
    return []
