"""The declared semantics, replica by replica: train, and compare with the reference.

Every rank trains the run and reports the global loss of each step, its module
after each step (and after the end of training), the module it holds between the
validation hooks where the example validates, and the export; the harness
trains the run as the declaration says (`plait.conformance.training.reference`) and
compares them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import torch
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.kind import Property
from plait.conformance.outcomes import rank_list
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.training.cases import TrainingCase
from plait.conformance.training.compare import OTHER_ORDER, loss_apart, tolerance
from plait.conformance.training.example import SLOWER, TrainingKind
from plait.conformance.training.flaws import diagnose, parted
from plait.conformance.training.generate import (
    ATTENTION_RUN,
    NORM_RUN,
    declared_period,
    grid_run,
    inside_second_period,
    runs,
)
from plait.conformance.training.loop import (
    Loop,
    TrainingReport,
    finish,
    scratch_directory,
    seed_streams,
)
from plait.conformance.training.reference import Reference, describe, reference
from plait.core import PeriodicAveraging, Synchronous

if TYPE_CHECKING:
    from plait.conformance.target import StrategyTarget
    from plait.conformance.training.cases import TrainingRun
    from plait.core import Strategy, TrainingSemantics
    from plait.core.training import Buffers

__all__ = [
    "DECLARED_SEMANTICS",
    "Replicas",
    "ReplicasCase",
    "check_replicas",
    "replicas",
    "replicas_grid",
]


@attrs.frozen(hash=False)
class ReplicasCase(TrainingCase):
    """An example of the declared semantics: train the run, report every replica.

    Attributes:
        validate_after: After how many steps each rank runs the strategy's
            validation hooks and reports the module it validates.
    """

    validate_after: tuple[int, ...] = attrs.field(default=(), kw_only=True)

    def __attrs_post_init__(self) -> None:
        if any(not 0 < after <= self.run.steps for after in self.validate_after):
            raise ValueError(
                f"validate_after={self.validate_after} must be within the run's "
                f"1..{self.run.steps} steps"
            )


@st.composite
def _validated(draw: st.DrawFn, semantics: TrainingSemantics) -> ReplicasCase:
    run = draw(runs(semantics))
    after = draw(st.lists(st.integers(1, run.steps), max_size=2, unique=True))
    return ReplicasCase(run, validate_after=tuple(sorted(after)))


def replicas(world_size: int, semantics: TrainingSemantics) -> st.SearchStrategy[ReplicasCase]:
    """Examples of the declared semantics: a run, its losses, replicas, validations, export."""
    del world_size  # every run fits every world size
    return _validated(semantics)


def replicas_grid(world_size: int, semantics: TrainingSemantics) -> list[ReplicasCase]:
    """The replicas examples every run tries first.

    The second has buffers; the third is a sequence model (split between
    context-parallel ranks where they are). The first validates inside a period and
    right after a meeting (synchronous: in the middle of the run).
    """
    del world_size
    period = declared_period(semantics)
    after = (2,) if period is None else tuple(sorted({inside_second_period(period), 2 * period}))
    return [
        ReplicasCase(grid_run(semantics), validate_after=after),
        ReplicasCase(grid_run(semantics, NORM_RUN)),
        ReplicasCase(grid_run(semantics, ATTENTION_RUN)),
    ]


DECLARED_SEMANTICS: Final = Property(
    "declared_semantics",
    "training at this world size gives what the strategy declares (Synchronous: one "
    "process on the global batch, accumulation in no_sync included; "
    "PeriodicAveraging: replicas on their own data meeting every k steps and at the "
    "end), loss by loss and replica by replica within the precision's rounding, "
    "for every model, optimizer (LBFGS with a closure) and scheduler; between the "
    "validation hooks each rank holds the module the declaration says it validates, "
    "and training goes on unchanged; the export is the trained module",
    draws=replicas,
    declared_grid=replicas_grid,
    over_groups=False,
    slower=SLOWER,
)


class Replicas(TrainingKind[ReplicasCase]):
    """Train the run; report the losses, this rank's module after each step, the export."""

    case_type = ReplicasCase
    properties = (DECLARED_SEMANTICS,)

    @override
    def train(
        self,
        strategy: Strategy,
        target: StrategyTarget,
        case: ReplicasCase,
        semantics: TrainingSemantics,
    ) -> TrainingReport:
        run = case.run
        seed_streams(run, strategy.global_rank)
        try:
            loop = Loop(strategy, run, model_seed=run.seed)
            replicas: list[tuple[float, ...]] = []
            validated: list[tuple[float, ...] | None] = []
            losses: list[float] = []
            loop.begin()
            for step in range(run.steps):
                losses += loop.train(step, step + 1, replicas)
                if step + 1 in case.validate_after:
                    validated.append(loop.validate())
            loop.end()
            buffers = loop.buffers()
            if not loop.sharded:
                replicas.append(loop.replica())
            with scratch_directory(strategy) as directory:
                export = loop.export(str(Path(directory) / "export"))
        finally:
            finish(strategy)
        return TrainingReport(
            semantics,
            losses=tuple(losses),
            replicas=None if loop.sharded else tuple(replicas),
            export=export,
            validated=None
            if loop.sharded
            else tuple(seen for seen in validated if seen is not None),
            data_parallel_size=loop.data_parallel_size,
            data_parallel_rank=loop.data_rank,
            buffers=buffers,
        )

    @override
    def check(self, case: ReplicasCase, reports: Sequence[TrainingReport]) -> list[str]:
        return check_replicas(case, reports)


def check_replicas(case: ReplicasCase, kept: Sequence[TrainingReport]) -> list[str]:
    """How every rank's losses, replicas and export differ from the declared semantics'."""
    run, world_size = case.run, kept[0].data_parallel(len(kept))
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
    updates = semantics.buffer_updates
    expected = reference(run, world_size, semantics.replicas, buffers=updates)
    problems = _judge(run, kept, expected, said)
    validation = _check_validation(case, kept, expected)
    validation += _check_buffers(run, kept, expected, semantics)
    if problems or validation:
        # Judged again within the rounding this example carries, measured only where
        # the fixed tolerance is not enough: the reference runs in other orders cost time.
        expected = reference(run, world_size, semantics.replicas, rounding=True, buffers=updates)
        problems = _judge(run, kept, expected, said)
        validation = _check_validation(case, kept, expected)
        validation += _check_buffers(run, kept, expected, semantics)
    if not problems:
        return validation
    # The cause, before the details: the likely flaw the run matches, and where
    # replicas declared one module part.
    cause = diagnose(
        run,
        kept,
        semantics.replicas,
        lambda other: _judge(
            run,
            kept,
            other.measured_as(expected),
            said,
        ),
    )
    if isinstance(semantics.replicas, Synchronous):
        split = parted(kept, tolerance(run.precision, run.optimizer))
        if split is not None:
            cause += f"; {split}"
    return [cause, *problems, *validation]


def _judge(
    run: TrainingRun, kept: Sequence[TrainingReport], expected: Reference, said: str
) -> list[str]:
    return (
        _check_losses(run, kept, expected, said)
        + _check_modules(run, kept, expected, said)
        + _check_export(run, kept[0].export, expected, said)
    )


_VALIDATED: Final = {
    "replicas": "its own replica",
    "mean": "the replicas' mean",
    "anchor": "the last meeting's module (the anchor)",
}


def _validated_by(semantics: TrainingSemantics) -> str:
    replicas = semantics.replicas
    return replicas.validates if isinstance(replicas, PeriodicAveraging) else "replicas"


def _check_validation(
    case: ReplicasCase, kept: Sequence[TrainingReport], expected: Reference
) -> list[str]:
    """Whether each rank validated what the declaration says, at each validation."""
    run = case.run
    declared = _validated_by(kept[0].semantics)
    problems: list[str] = []
    for index, report in enumerate(kept):
        if report.validated is None:
            continue
        if len(report.validated) != len(case.validate_after):
            problems.append(
                f"rank {index}: reported {len(report.validated)} validated modules for "
                f"{len(case.validate_after)} validations"
            )
            continue
        for taken, seen in zip(case.validate_after, report.validated, strict=True):
            found = torch.tensor(seen, dtype=torch.float64)
            step = taken - 1
            choices = {
                "replicas": expected.replicas[step][index],
                "mean": torch.stack([one.double() for one in expected.replicas[step]]).mean(0),
                "anchor": expected.anchors[step],
            }
            rounding = expected.rounding(step)
            if _close(found, choices[declared], run, rounding):
                continue
            others = [
                _VALIDATED[name]
                for name, value in choices.items()
                if name != declared and _close(found, value, run, rounding)
            ]
            seen_as = (
                f"it validated {others[0]}"
                if others
                else "it validated none of its replica, the replicas' mean, the anchor"
            )
            problems.append(
                f"rank {index}: after step {step}, the module it validates (between "
                f"on_validation_start and on_validation_end) is not {_VALIDATED[declared]} "
                f"(validates={declared!r} declared): {seen_as}; "
                f"{_largest(found, choices[declared])}"
            )
            break
    return problems


_BUFFERS: Final = {
    "broadcast": "each window of a step starts from rank 0's buffers",
    "own": "each rank keeps its own",
}


def _check_buffers(
    run: TrainingRun,
    kept: Sequence[TrainingReport],
    expected: Reference,
    semantics: TrainingSemantics,
) -> list[str]:
    """Whether each rank's buffers after training are what the declaration says."""
    declared = semantics.buffer_updates
    for index, report in enumerate(kept):
        # A tensor-parallel group's ranks read their data-parallel rank's data.
        place = index if report.data_parallel_rank is None else report.data_parallel_rank
        if place >= len(expected.buffers) or not expected.buffers[place].numel():
            continue
        found = torch.tensor(report.buffers, dtype=torch.float64)
        want = expected.buffers[place]
        if _close(found, want, run, expected.buffer_rounding(place)):
            continue
        matches = ""
        if isinstance(semantics.replicas, Synchronous):
            other: Buffers = "own" if declared == "broadcast" else "broadcast"
            theirs = reference(run, len(expected.buffers), semantics.replicas, buffers=other)
            if _close(found, theirs.buffers[place], run, expected.buffer_rounding(place)):
                matches = f"; they are what buffers={other!r} gives ({_BUFFERS[other]})"
        return [
            (
                f"rank {index}: its buffers after training (BatchNorm's running statistics, "
                f"flattened) are not what buffers={declared!r} declared gives "
                f"({_BUFFERS[declared]}){matches}: {_largest(found, want)}"
            )
        ]
    return []


def _check_losses(
    run: TrainingRun, kept: Sequence[TrainingReport], expected: Reference, said: str
) -> list[str]:
    close = tolerance(run.precision, run.optimizer)
    problems: list[str] = []
    for index, report in enumerate(kept):
        if len(report.losses) != len(expected.losses):
            problems.append(
                f"rank {index}: reported {len(report.losses)} losses for {run.steps} steps"
            )
            continue
        step = loss_apart(
            expected.losses,
            report.losses,
            close,
            margin=OTHER_ORDER,
            rounding=lambda step: expected.rounding(step, loss=True),
        )
        if step is not None:
            got, want = report.losses[step], expected.losses[step]
            problems.append(
                f"rank {index}: the loss of step {step} is {got:.6g}; {said} gives {want:.6g}"
            )
    return problems


def _check_modules(
    run: TrainingRun, kept: Sequence[TrainingReport], expected: Reference, said: str
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
        if not _close(got.float(), want.float(), run, expected.final_rounding(name)):
            return [
                (
                    f"the exported module's {name!r} is not the trained module {said} gives: "
                    f"{_largest(got.float(), want.float())}"
                )
            ]
    return []


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


EXAMPLE_KINDS.register(Replicas())
