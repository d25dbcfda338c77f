"""A rank's part of a training example: a loop of its own on the strategy's public API.

The loop is the one a platform team writes (``setup_module_and_optimizers``,
``training_step``, ``backward`` in ``no_sync`` but for a window's last micro-batch,
``optimizer_step``, ``zero_grad``, schedulers, ``save_checkpoint`` and
``load_checkpoint``), and it calls the strategy's lifecycle hooks where a Trainer
would. Each run builds a fresh strategy, as a new process would: what a strategy
keeps of its own (a step counter, an outer optimizer) must travel in its checkpoint.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import torch
import torch.distributed.tensor

from plait.conformance.training.models import (
    Scheduler,
    make_model,
    make_optimizer,
    make_scheduler,
    micro_batch,
    step_scheduler,
)
from plait.core import (
    ConfigurationError,
    SupportsLifecycleHooks,
    SupportsReplace,
    SupportsShardedModule,
    Synchronous,
    TrainingSemantics,
    training_semantics_of,
)

if TYPE_CHECKING:
    from plait.conformance.target import StrategyTarget
    from plait.conformance.training.cases import StateValue, TrainingCase, TrainingRun
    from plait.core import Strategy

__all__ = ["Refused", "TrainingReport", "run_training", "user_value"]

_FRESH_SEED: Final = 10_007  # a resumed run's model starts elsewhere: the load must restore it


class Refused(Exception):  # noqa: N818 - a documented refusal, not a failure
    """The strategy refused the example's settings with a `ConfigurationError`."""


@attrs.frozen(hash=False)  # it holds tensors
class TrainingReport:
    """What a rank sends back from a training example.

    Attributes:
        semantics: What the strategy declares.
        losses: The global loss of each optimizer step the example reports.
        replicas: This rank's parameters after each step (and a last entry after
            ``on_train_end``), flattened; None where the strategy shards the module.
        export: The module ``export_checkpoint`` wrote (rank 0 reads it; None elsewhere).
        problems: What the rank found wrong itself (a round trip, a resume).
        refused: The strategy's `ConfigurationError` for the example's settings.
        checkpoint: The checkpoint a ``"move_out"`` example left for the moves.
    """

    semantics: TrainingSemantics
    losses: tuple[float, ...] = ()
    replicas: tuple[tuple[float, ...], ...] | None = None
    export: dict[str, torch.Tensor] | None = None
    problems: tuple[str, ...] = ()
    refused: str | None = None
    checkpoint: str | None = None


@attrs.define
class _Progress:
    """The run as a strategy's ``on_fit_start`` reads it (`plait.core.RunProgress`)."""

    global_step: int = 0
    current_epoch: int = 0


class _UserState:
    """A user's `Stateful` object: nested containers, keys of every kind, tensors."""

    def __init__(self, value: object) -> None:
        self.value = value

    def state_dict(self) -> dict[str, object]:
        return {"value": self.value}

    def load_state_dict(self, state_dict: Mapping[str, object], /) -> None:
        self.value = state_dict["value"]


def user_value(value: StateValue) -> object:
    """A drawn user state with its tuples of floats made tensors."""
    if isinstance(value, tuple):
        return torch.tensor(value, dtype=torch.float32)
    if isinstance(value, list):
        return [user_value(item) for item in value]
    if isinstance(value, dict):
        return {key: user_value(item) for key, item in value.items()}
    return value


def _random_state() -> dict[str, object]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def _set_random_state(state: Mapping[str, object]) -> None:
    torch_state = state["torch"]
    python_state = state["python"]
    assert isinstance(torch_state, torch.Tensor)
    torch.set_rng_state(torch_state)
    random.setstate(python_state)  # type: ignore[arg-type]


def build_strategy(target: StrategyTarget, run: TrainingRun, checkpoint_io: str | None) -> Strategy:
    """A fresh strategy of ``target`` with the run's precision and ``checkpoint_io``, joined.

    Raises:
        Refused: The strategy does not take those settings.
    """
    strategy = target.build()
    changes: dict[str, object] = {}
    if run.precision != "32-true":
        changes["precision"] = run.precision
    if checkpoint_io is not None:
        changes["checkpoint_io"] = checkpoint_io
    if changes:
        if not isinstance(strategy, SupportsReplace):
            raise Refused(
                f"{type(strategy).__name__} cannot be made again with {sorted(changes)} "
                "(it does not implement plait.core.SupportsReplace)"
            )
        try:
            strategy = strategy.replace(**changes)
        except ConfigurationError as error:
            raise Refused(str(error)) from error
    strategy.setup_environment()
    return strategy


class _Loop:
    """The example's training loop on one fresh strategy."""

    def __init__(self, strategy: Strategy, run: TrainingRun, *, model_seed: int) -> None:
        self.strategy = strategy
        self.run = run
        self.rank = strategy.global_rank
        self.world_size = strategy.world_size
        model = make_model(attrs.evolve(run, seed=model_seed))
        optimizer = make_optimizer(run, model.parameters())
        if run.optimizer == "lbfgs" and hasattr(strategy, "check_closure_optimizer"):
            try:
                strategy.check_closure_optimizer(optimizer)
            except ConfigurationError as error:
                raise Refused(str(error)) from error
        try:
            self.module, optimizers = strategy.setup_module_and_optimizers(model, [optimizer])
        except ConfigurationError as error:
            raise Refused(str(error)) from error
        self.optimizer = optimizers[0]
        self.scheduler: Scheduler | None = make_scheduler(run, self.optimizer)
        self.progress = _Progress()
        self.epoch_losses: list[float] = []
        self.sharded = isinstance(strategy, SupportsShardedModule) and strategy.shards_module
        self.synchronous = isinstance(training_semantics_of(strategy).replicas, Synchronous)
        self.hooks = strategy if isinstance(strategy, SupportsLifecycleHooks) else None

    # Steps.

    def window(self, step: int, count: int) -> torch.Tensor:
        """Forward and backward of the first ``count`` micro-batches of ``step``'s window."""
        strategy, run = self.strategy, self.run
        total = torch.zeros((), device=strategy.root_device)
        for window in range(count):
            inputs, targets = micro_batch(run, self.world_size, self.rank, step, window)
            inputs = inputs.to(strategy.root_device)
            targets = targets.to(strategy.root_device)
            synchronising = window == run.accumulate - 1
            with strategy.no_sync(self.module, enabled=not synchronising):
                output = strategy.training_step(self.module, inputs)
                assert isinstance(output, torch.Tensor)
                loss = torch.nn.functional.cross_entropy(output.float(), targets)
                loss = loss / run.accumulate
                strategy.backward(loss, self.module)
            total = total + loss.detach()
        return total

    def step(self, step: int) -> float:
        """Optimizer step ``step`` (counted from 0): its global loss."""
        strategy, optimizer = self.strategy, self.optimizer
        if self.run.optimizer == "lbfgs":
            first: list[torch.Tensor] = []
            synchronous = self.synchronous

            def closure() -> torch.Tensor:
                # LBFGS keeps the loss it is given and decides from it and from the
                # gradients how often to call this: where the gradients are the same
                # on every rank, every rank must give it the global loss (or their
                # optimizers part ways); where each replica is its own, its own loss
                # (a collective here would meet a rank that already stopped calling).
                strategy.zero_grad(optimizer)
                local = self.window(step, self.run.accumulate).float()
                loss = strategy.reduce(local, reduce_op="mean") if synchronous else local
                if not first:
                    first.append(local)
                return loss

            strategy.optimizer_step(optimizer, closure=closure)
            local = first[0]
        else:
            local = self.window(step, self.run.accumulate).float()
            strategy.optimizer_step(optimizer)
        loss = float(strategy.reduce(local, reduce_op="mean").item())
        strategy.zero_grad(optimizer)
        if step % self.run.steps_per_epoch == 0:
            self.epoch_losses = []
        self.epoch_losses.append(loss)
        step_scheduler(self.run, self.scheduler, step, self.epoch_losses)
        self.progress.global_step = step + 1
        self.progress.current_epoch = (step + 1) // self.run.steps_per_epoch
        return loss

    def train(
        self, start: int, stop: int, replicas: list[tuple[float, ...]] | None = None
    ) -> list[float]:
        """Steps ``start`` to ``stop``: their losses (and the replicas after each)."""
        losses = []
        for step in range(start, stop):
            losses.append(self.step(step))
            if replicas is not None and not self.sharded:
                replicas.append(self.replica())
        return losses

    def begin(self) -> None:
        """Where a Trainer starts fitting: the strategy's hooks."""
        if self.hooks is not None:
            self.hooks.on_fit_start(self.progress)
            self.hooks.on_train_start()

    def end(self) -> None:
        """Where a Trainer's fit ends: the strategy's hooks."""
        if self.hooks is not None:
            self.hooks.on_train_end()
            self.hooks.on_fit_end()

    # State.

    def replica(self) -> tuple[float, ...]:
        """This rank's parameters, flattened (the module as the rank holds it)."""
        inner = self.strategy.unwrap_module(self.module)
        values = [_whole(parameter).float().reshape(-1).cpu() for parameter in inner.parameters()]
        return tuple(torch.cat(values).tolist()) if values else ()

    def state(self, user: _UserState | None = None) -> dict[str, object]:
        """What the example saves: the live objects, the loop's place and the random streams."""
        streams = [
            self.strategy.broadcast(_random_state(), src=rank) for rank in range(self.world_size)
        ]
        state: dict[str, object] = {
            "model": self.module,
            "optimizer": self.optimizer,
            "loop": {"step": self.progress.global_step, "epoch_losses": list(self.epoch_losses)},
            "random": streams,
        }
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler
        if user is not None:
            state["user"] = user
        return state

    def restore(self, path: str, user: _UserState | None = None) -> dict[str, object]:
        """Load ``path`` into this loop's objects; the rest, as the strategy gives it back."""
        state: dict[str, object] = {"model": self.module, "optimizer": self.optimizer}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler
        if user is not None:
            state["user"] = user
        rest = dict(self.strategy.load_checkpoint(path, state))
        loop = rest.get("loop")
        streams = rest.get("random")
        if not isinstance(loop, Mapping) or not isinstance(streams, Sequence):
            raise AssertionError(
                f"load_checkpoint gave back {sorted(rest)}: the loop's place ('loop') and "
                "the random streams ('random') the example saved as plain entries are missing"
            )
        self.progress.global_step = int(loop["step"])
        self.progress.current_epoch = self.progress.global_step // self.run.steps_per_epoch
        self.epoch_losses = [float(value) for value in loop["epoch_losses"]]
        _set_random_state(streams[self.rank])
        return rest

    def export(self, where: str) -> dict[str, torch.Tensor] | None:
        """The module as ``export_checkpoint`` writes it at ``where``, read back on rank 0."""
        path = where + ".pt"
        self.strategy.export_checkpoint(self.module, path)
        self.strategy.barrier()
        if self.rank != 0:
            return None
        loaded = torch.load(path, map_location="cpu", weights_only=True)
        state = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else loaded
        return {str(name): value for name, value in dict(state).items()}

    def snapshot(self) -> dict[str, object]:
        """Every state the round trip restores, copied (as this rank sees it)."""
        taken = self.strategy.get_state_dict(self.module, [self.optimizer])
        return {
            "module": _copied(taken.get("state_dict")),
            "optimizer": _copied(taken.get("optimizer_states")),
            # The objects themselves, besides what the strategy says of them: a
            # strategy that saves a state without something would say the same of
            # the state it loads back.
            "module's tensors": _copied(self.strategy.unwrap_module(self.module).state_dict()),
            "optimizer's state": _own_state(self.optimizer),
            "scheduler": _copied(self.scheduler.state_dict() if self.scheduler else None),
            "random": _copied(_random_state()),
            "loop": (self.progress.global_step, list(self.epoch_losses)),
        }


def _own_state(optimizer: torch.optim.Optimizer) -> object:
    """What ``optimizer`` itself holds, or None where it cannot say alone.

    A `ZeroRedundancyOptimizer` must gather its shards first, and an optimizer whose
    parameters a library replaced (DeepSpeed's ZeRO-3 partitions, XLA's device
    copies) may hold state under parameters its groups no longer name: what the
    strategy's `get_state_dict` says of it is compared instead.
    """
    try:
        return _copied(optimizer.state_dict())
    except (RuntimeError, KeyError):
        return None


def _whole(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter as a plain tensor (a DTensor's whole value: every rank calls it)."""
    if isinstance(parameter, torch.distributed.tensor.DTensor):
        whole: torch.Tensor = parameter.full_tensor()
        return whole.detach()
    return parameter.detach()


def _copied(value: object) -> object:
    if isinstance(value, torch.distributed.tensor.DTensor):
        return value.to_local().detach().clone().cpu()
    if isinstance(value, torch.Tensor):
        return value.detach().clone().cpu()
    if isinstance(value, Mapping):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copied(item) for item in value)
    return value


def differences(expected: object, found: object, where: str = "") -> list[str]:
    """Where ``found`` differs from ``expected``: values, dtypes, key types, containers."""
    if isinstance(expected, torch.Tensor):
        return _tensor_differences(expected, found, where)
    if isinstance(expected, Mapping):
        return _mapping_differences(expected, found, where)
    if isinstance(expected, list | tuple):
        if not isinstance(found, list | tuple) or len(found) != len(expected):
            return [f"{where or 'the value'}: {_short(expected)} became {_short(found)}"]
        return [
            problem
            for index, (item, other) in enumerate(zip(expected, found, strict=True))
            for problem in differences(item, other, f"{where}[{index}]")
        ]
    if type(expected) is not type(found) or expected != found:
        return [f"{where or 'the value'}: {_short(expected)} became {_short(found)}"]
    return []


def _tensor_differences(expected: torch.Tensor, found: object, where: str) -> list[str]:
    if not isinstance(found, torch.Tensor):
        return [f"{where or 'the value'}: a tensor became a {type(found).__name__}"]
    if expected.dtype != found.dtype or expected.shape != found.shape:
        return [
            (
                f"{where}: {expected.dtype} of shape {tuple(expected.shape)} became "
                f"{found.dtype} of shape {tuple(found.shape)}"
            )
        ]
    if not torch.equal(expected.cpu(), found.cpu()):
        return [f"{where}: the values differ ({_first_difference(expected, found)})"]
    return []


def _mapping_differences(expected: Mapping[object, object], found: object, where: str) -> list[str]:
    if not isinstance(found, Mapping):
        return [f"{where or 'the value'}: a mapping became a {type(found).__name__}"]
    problems = []
    missing = [key for key in expected if key not in found]
    extra = [key for key in found if key not in expected]
    if missing:
        strings = [key for key in missing if str(key) in found]
        if strings:
            problems.append(f"{where or 'the state'}: the keys {strings!r} came back as strings")
        else:
            problems.append(f"{where or 'the state'}: the keys {missing!r} are missing")
    elif extra:
        problems.append(f"{where or 'the state'}: the keys {extra!r} appeared")
    for key in expected:
        if key in found:
            problems += differences(expected[key], found[key], f"{where}[{key!r}]")
    return problems


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _first_difference(expected: torch.Tensor, found: torch.Tensor) -> str:
    wide = expected.detach().double().cpu().reshape(-1)
    other = found.detach().double().cpu().reshape(-1)
    index = int((wide != other).nonzero()[0])
    return f"at flat index {index}: {wide[index].item()!r} became {other[index].item()!r}"


def _shared_directory(strategy: Strategy, prefix: str) -> str:
    """A new directory rank 0 makes, named alike on every rank (every rank calls it)."""
    made = tempfile.mkdtemp(prefix=prefix) if strategy.global_rank == 0 else ""
    return strategy.broadcast(made, src=0)


@contextlib.contextmanager
def _directory(strategy: Strategy) -> Iterator[str]:
    """A directory every rank names alike, removed by rank 0 once every rank is done.

    A rank whose work in it raised does not wait for the others: its error is the
    example's report, where a barrier the others never reach would hide it.
    """
    directory = _shared_directory(strategy, "plait-kit-")
    try:
        yield directory
    except BaseException:
        if strategy.global_rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    strategy.barrier()
    if strategy.global_rank == 0:
        shutil.rmtree(directory, ignore_errors=True)


def _seed_streams(run: TrainingRun, rank: int) -> None:
    torch.manual_seed(run.seed * 7 + rank)
    random.seed(run.seed * 11 + rank)


def _finish(strategy: Strategy) -> None:
    with contextlib.suppress(Exception):
        strategy.teardown()


def run_training(target: StrategyTarget, case: TrainingCase) -> TrainingReport:
    """This rank's part of ``case``: every run on a fresh strategy of ``target``."""
    try:
        first = build_strategy(target, case.run, case.checkpoint_io)
    except Refused as refusal:
        return TrainingReport(TrainingSemantics(), refused=str(refusal))
    semantics = training_semantics_of(first)
    try:
        if case.kind == "resume":
            return _resume(first, target, case, semantics)
        return _KINDS[case.kind](first, case, semantics)
    except Refused as refusal:
        return TrainingReport(semantics, refused=str(refusal))


def _replicas(
    strategy: Strategy, case: TrainingCase, semantics: TrainingSemantics
) -> TrainingReport:
    run = case.run
    _seed_streams(run, strategy.global_rank)
    try:
        loop = _Loop(strategy, run, model_seed=run.seed)
        replicas: list[tuple[float, ...]] = []
        loop.begin()
        losses = loop.train(0, run.steps, replicas)
        loop.end()
        if not loop.sharded:
            replicas.append(loop.replica())
        with _directory(strategy) as directory:
            export = loop.export(str(Path(directory) / "export"))
    finally:
        _finish(strategy)
    return TrainingReport(
        semantics,
        losses=tuple(losses),
        replicas=None if loop.sharded else tuple(replicas),
        export=export,
    )


def _round_trip(
    strategy: Strategy, case: TrainingCase, semantics: TrainingSemantics
) -> TrainingReport:
    run = case.run
    _seed_streams(run, strategy.global_rank)
    problems: list[str] = []
    try:
        loop = _Loop(strategy, run, model_seed=run.seed)
        user = _UserState(user_value(case.user_state))
        loop.begin()
        loop.train(0, case.stop_at)
        with _directory(strategy) as directory:
            path = str(Path(directory) / "checkpoint")
            saved_user = _copied(user.value)
            strategy.save_checkpoint(loop.state(user), path)
            strategy.barrier()  # where rank 0 writes alone, it has written
            saved = loop.snapshot()
            # Disturb everything, then load it back into the same objects.
            loop.train(case.stop_at, case.stop_at + 1)
            user.value = {"disturbed": True}
            torch.rand(3)
            random.random()
            loop.restore(path, user)
            loaded = loop.snapshot()
            for part in saved:
                problems += [
                    f"after a save and a load, {part}{problem.removeprefix('the value')}"
                    for problem in differences(saved[part], loaded[part])
                ]
            problems += [
                f"after a save and a load, the user's Stateful object{problem}"
                for problem in differences(saved_user, user.value)
            ]
            problems += _module_alone(loop, path, saved)
    finally:
        _finish(strategy)
    return TrainingReport(semantics, problems=tuple(problems))


def _module_alone(loop: _Loop, path: str, saved: dict[str, object]) -> list[str]:
    """The load contract: the module alone is restored, every optimizer left as it was."""
    loop.train(loop.progress.global_step, loop.progress.global_step + 1)
    before = loop.snapshot()
    rest = dict(loop.strategy.load_checkpoint(path, loop.module))
    after = loop.snapshot()
    problems = [
        f"load_checkpoint(path, module) did not restore the module: {problem}"
        for problem in differences(saved["module"], after["module"])
    ]
    problems += [
        f"load_checkpoint(path, module) changed the optimizer's state: {problem}"
        for problem in differences(before["optimizer"], after["optimizer"])
    ]
    read = sorted(
        str(key) for key in rest if key in ("model", "optimizer", "state_dict", "optimizer_states")
    )
    if read:
        problems.append(
            f"load_checkpoint(path, module) gave back {read}: the module and optimizer "
            "states are not the run's entries"
        )
    if "loop" not in rest:
        problems.append(
            f"load_checkpoint(path, module) gave back {sorted(map(str, rest))}, without the "
            "run's entry 'loop'"
        )
    return problems


def _resume(
    first: Strategy, target: StrategyTarget, case: TrainingCase, semantics: TrainingSemantics
) -> TrainingReport:
    run = case.run
    rank = first.global_rank
    directory = _shared_directory(first, "plait-kit-")
    path = str(Path(directory) / "checkpoint")
    last: Strategy = first
    try:
        expected, expected_replica, expected_export = _never_stopped(first, run, directory)
        # The run stopped after stop_at steps (and stop_inside micro-batches).
        last = stopped_strategy = build_strategy(target, run, case.checkpoint_io)
        _seed_streams(run, rank)
        try:
            stopped = _Loop(stopped_strategy, run, model_seed=run.seed)
            stopped.begin()
            before = stopped.train(0, case.stop_at)
            if case.stop_inside and case.stop_at < run.steps:
                stopped.window(case.stop_at, case.stop_inside)
            stopped_strategy.save_checkpoint(stopped.state(), path)
            stopped_strategy.barrier()
        finally:
            _finish(stopped_strategy)
        # The same run resumed in a fresh strategy, from a model that starts elsewhere.
        last = resumed_strategy = build_strategy(target, run, case.checkpoint_io)
        # A new run starts once the stopped one has ended (its writes finished).
        resumed_strategy.barrier()
        torch.manual_seed(_FRESH_SEED + rank)
        try:
            resumed = _Loop(resumed_strategy, run, model_seed=run.seed + _FRESH_SEED)
            resumed.restore(path)
            resumed.begin()
            after = resumed.train(case.stop_at, run.steps)
            resumed.end()
            found_replica = None if resumed.sharded else resumed.replica()
            found_export = resumed.export(str(Path(directory) / "resumed"))
        finally:
            _finish(resumed_strategy)
    finally:
        _remove(last, directory)
    stop = f"stopped after {case.stop_at} steps" + (
        f" and {case.stop_inside} micro-batches of the next window" if case.stop_inside else ""
    )
    exact = semantics.exact_resume
    close = None if exact else tolerance(run.precision, run.optimizer)
    problems = _compare_losses(expected, before + after, stop, close=close)
    if expected_replica is not None and found_replica is not None:
        problems += _compare_vectors(
            expected_replica, found_replica, f"{stop} and resumed, this rank's module", close
        )
    if expected_export is not None and found_export is not None:
        problems += [
            f"{stop} and resumed, the exported module{problem.removeprefix('the value')}"
            for problem in _close_states(expected_export, found_export, close=close)
        ]
    return TrainingReport(semantics, losses=tuple(before + after), problems=tuple(problems))


def _never_stopped(
    strategy: Strategy, run: TrainingRun, directory: str
) -> tuple[list[float], tuple[float, ...] | None, dict[str, torch.Tensor] | None]:
    """The run's losses, this rank's module and the export, never stopped."""
    _seed_streams(run, strategy.global_rank)
    try:
        whole = _Loop(strategy, run, model_seed=run.seed)
        whole.begin()
        losses = whole.train(0, run.steps)
        whole.end()
        replica = None if whole.sharded else whole.replica()
        return losses, replica, whole.export(str(Path(directory) / "whole"))
    finally:
        _finish(strategy)


def _remove(strategy: Strategy, directory: str) -> None:
    """Rank 0 removes ``directory`` once every rank is done with it."""
    with contextlib.suppress(Exception):
        strategy.barrier()
    if strategy.global_rank == 0:
        shutil.rmtree(directory, ignore_errors=True)


def _move_out(
    strategy: Strategy, case: TrainingCase, semantics: TrainingSemantics
) -> TrainingReport:
    run = case.run
    _seed_streams(run, strategy.global_rank)
    try:
        loop = _Loop(strategy, run, model_seed=run.seed)
        loop.begin()
        loop.train(0, case.stop_at)
        directory = _shared_directory(strategy, "plait-kit-move-")
        path = str(Path(directory) / "checkpoint")
        strategy.save_checkpoint(loop.state(), path)
        strategy.barrier()
        after = loop.train(case.stop_at, run.steps)
        loop.end()
    finally:
        _finish(strategy)
    return TrainingReport(semantics, losses=tuple(after), checkpoint=path)


def _move_in(
    strategy: Strategy, case: TrainingCase, semantics: TrainingSemantics
) -> TrainingReport:
    run = case.run
    assert case.source is not None
    torch.manual_seed(_FRESH_SEED + strategy.global_rank)
    try:
        loop = _Loop(strategy, run, model_seed=run.seed + _FRESH_SEED)
        loop.restore(case.source)
        loop.begin()
        after = loop.train(case.stop_at, run.steps)
        loop.end()
    finally:
        _finish(strategy)
    return TrainingReport(semantics, losses=tuple(after))


# Comparisons a rank makes itself.

TOLERANCES: Final = {"32-true": (1e-4, 1e-5), "64-true": (1e-9, 1e-10)}
"""Per precision, the relative and absolute tolerance of values that may round apart."""

LOOSE: Final = (5e-2, 5e-2)
"""The tolerance of a precision of 16 bits (``bf16-mixed``, ``16-mixed``, ...)."""


def tolerance(precision: str, optimizer: str = "sgd") -> tuple[float, float]:
    """The relative and absolute tolerance of ``precision`` (LBFGS: ten times it).

    LBFGS's two-loop recursion divides by differences of gradients, which magnifies
    the rounding of a sum taken in another order.
    """
    rtol, atol = TOLERANCES.get(precision, LOOSE)
    return (rtol * 10, atol * 10) if optimizer == "lbfgs" else (rtol, atol)


def _compare_losses(
    expected: Sequence[float],
    found: Sequence[float],
    stop: str,
    *,
    close: tuple[float, float] | None,
) -> list[str]:
    """``close``: the relative and absolute tolerance, or None for bit for bit."""
    if len(expected) != len(found):
        return [f"{stop} and resumed, the run took {len(found)} steps, not {len(expected)}"]
    for step, (want, got) in enumerate(zip(expected, found, strict=True)):
        same = want == got if close is None else abs(want - got) <= close[0] * max(1.0, abs(want))
        if not same:
            return [
                (
                    f"{stop} and resumed, the loss of step {step} is {got!r}, and {want!r} in "
                    f"the run never stopped"
                    + (" (bit for bit, as declared)" if close is None else "")
                )
            ]
    return []


def _compare_vectors(
    expected: Sequence[float], found: Sequence[float], what: str, close: tuple[float, float] | None
) -> list[str]:
    want = torch.tensor(expected, dtype=torch.float64)
    got = torch.tensor(found, dtype=torch.float64)
    if want.shape != got.shape:
        return [f"{what} has {got.numel()} parameters, not {want.numel()}"]
    if close is None:
        same = torch.equal(want, got)
    else:
        same = torch.allclose(want, got, rtol=close[0], atol=close[1])
    if same:
        return []
    return [f"{what} differs from the run never stopped ({_first_difference(want, got)})"]


def _close_states(
    expected: Mapping[str, torch.Tensor],
    found: Mapping[str, torch.Tensor],
    *,
    close: tuple[float, float] | None,
) -> list[str]:
    if close is None:
        return differences(dict(expected), dict(found))
    problems = []
    for name, value in expected.items():
        other = found.get(name)
        if other is None or other.shape != value.shape:
            problems.append(f"[{name!r}]: missing or of another shape")
        elif not torch.allclose(value.double(), other.double(), rtol=close[0], atol=close[1]):
            problems.append(f"[{name!r}]: {_first_difference(value, other)}")
    return problems


_KINDS: Final[dict[str, Callable[[Strategy, TrainingCase, TrainingSemantics], TrainingReport]]] = {
    "replicas": _replicas,
    "round_trip": _round_trip,
    "move_out": _move_out,
    "move_in": _move_in,
}
