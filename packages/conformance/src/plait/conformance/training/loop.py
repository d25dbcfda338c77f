"""A rank's training loop for the kit's examples: its own, on the strategy's public API.

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
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import attrs
import torch
import torch.distributed.tensor

from plait.conformance.training.compare import copied, own_state
from plait.conformance.training.models import (
    Scheduler,
    make_model,
    make_optimizer,
    make_scheduler,
    micro_batch,
    step_scheduler,
)
from plait.conformance.training.parallel import (
    Unstaged,
    parallelize,
    pipelined,
    split_sequences,
    stages_of,
)
from plait.core import (
    ConfigurationError,
    SupportsContextParallel,
    SupportsLifecycleHooks,
    SupportsReplace,
    SupportsShardedModule,
    Synchronous,
    TrainingSemantics,
    training_semantics_of,
)

if TYPE_CHECKING:
    from plait.conformance.target import StrategyTarget
    from plait.conformance.training.cases import StateValue, TrainingRun
    from plait.core import Strategy

__all__ = [
    "FRESH_SEED",
    "Loop",
    "Refused",
    "TrainingReport",
    "UserState",
    "build_strategy",
    "finish",
    "scratch_directory",
    "seed_streams",
    "shared_directory",
    "user_value",
]

FRESH_SEED: Final = 10_007  # a resumed run's model starts elsewhere: the load must restore it


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
    validated: tuple[tuple[float, ...], ...] | None = None
    """The module this rank validated at each of the example's validations, flattened;
    None where the strategy shards the module."""
    buffers: tuple[float, ...] = ()
    """This rank's buffers after training (BatchNorm's running statistics), flattened."""
    data_parallel_rank: int | None = None
    """The data this rank reads (its replica's place in the reference); None: its rank."""
    data_parallel_size: int | None = None
    """How many ranks read different data (the reference's world); None: every rank
    (a tensor-parallel group's ranks read the same)."""

    def data_parallel(self, world_size: int) -> int:
        """The ranks that read different data in a job of ``world_size`` ranks."""
        return world_size if self.data_parallel_size is None else self.data_parallel_size


@attrs.define
class _Progress:
    """The run as a strategy's ``on_fit_start`` reads it (`plait.core.RunProgress`)."""

    global_step: int = 0
    current_epoch: int = 0


class UserState:
    """A user's `Stateful` object: nested containers, keys of every kind, tensors."""

    def __init__(self, value: object) -> None:
        self.value = value

    def state_dict(self) -> dict[str, object]:
        """What it holds, under ``"value"``."""
        return {"value": self.value}

    def load_state_dict(self, state_dict: Mapping[str, object], /) -> None:
        """Hold what ``state_dict`` holds."""
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


class Loop:
    """The example's training loop on one fresh strategy."""

    def __init__(self, strategy: Strategy, run: TrainingRun, *, model_seed: int) -> None:
        self.strategy = strategy
        self.run = run
        self.rank = strategy.global_rank
        self.world_size = strategy.world_size
        layout = strategy.layout
        # The data this rank reads: under tensor parallelism, that of its data-parallel
        # rank (the ranks of a tensor-parallel group read the same batches).
        self.data_rank = layout.data_parallel_rank
        self.data_parallel_size = layout.data_parallel_size
        semantics = training_semantics_of(strategy)
        model = make_model(attrs.evolve(run, seed=model_seed))
        # Under a pipeline the schedule runs each window's forward and backward.
        self.pipelined = semantics.parallelized_by_module and pipelined(strategy)
        if self.pipelined:
            try:
                model = stages_of(model, run, strategy, self._window_loss)
            except (Unstaged, ConfigurationError) as refusal:
                raise Refused(str(refusal)) from refusal
        elif semantics.parallelized_by_module:
            parallelize(model, run, strategy)
        # Each rank of a cp group takes its own tokens of every sequence.
        self.split = semantics.parallelized_by_module and split_sequences(model, strategy)
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
        self.synchronous = isinstance(semantics.replicas, Synchronous)
        self.hooks = strategy if isinstance(strategy, SupportsLifecycleHooks) else None

    # Steps.

    def _window_loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """A micro-batch's share of its window's loss."""
        loss = torch.nn.functional.cross_entropy(output.float(), targets)
        return loss / self.run.accumulate

    def window(self, step: int, count: int) -> torch.Tensor:
        """Forward and backward of the first ``count`` micro-batches of ``step``'s window."""
        strategy, run = self.strategy, self.run
        total = torch.zeros((), device=strategy.root_device)
        for window in range(count):
            inputs, targets = micro_batch(
                run, self.data_parallel_size, self.data_rank, step, window
            )
            inputs = inputs.to(strategy.root_device)
            targets = targets.to(strategy.root_device)
            if self.split:
                assert isinstance(strategy, SupportsContextParallel)
                inputs = strategy.shard_sequence(inputs, dim=1)
            synchronising = window == run.accumulate - 1
            with strategy.no_sync(self.module, enabled=not synchronising):
                if self.pipelined:
                    # The schedule's forward and backward, the loss on every rank.
                    loss = strategy.training_step(self.module, inputs, target=targets)
                    assert isinstance(loss, torch.Tensor)
                else:
                    output = strategy.training_step(self.module, inputs)
                    assert isinstance(output, torch.Tensor)
                    loss = self._window_loss(output, targets)
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

    def validate(self) -> tuple[float, ...] | None:
        """Where a Trainer validates: the module the rank validates between the hooks.

        None where the module is sharded (every rank still calls the hooks).
        """
        if self.hooks is not None:
            self.hooks.on_validation_start()
        seen = None if self.sharded else self.replica()
        if self.hooks is not None:
            self.hooks.on_validation_end()
        return seen

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

    def buffers(self) -> tuple[float, ...]:
        """This rank's buffers (the module as the rank holds it), flattened."""
        inner = self.strategy.unwrap_module(self.module)
        values = [_whole(buffer).double().reshape(-1).cpu() for buffer in inner.buffers()]
        return tuple(torch.cat(values).tolist()) if values else ()

    def state(self, user: UserState | None = None) -> dict[str, object]:
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

    def restore(self, path: str, user: UserState | None = None) -> dict[str, object]:
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
        if self.rank < len(streams):  # a run resized to more ranks: the new ones start afresh
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
        """Every state the round trip restores, copied (as this rank sees it).

        Besides the module's and the optimizers' entries, whatever else the
        strategy's ``get_state_dict`` holds (a step counter, an outer optimizer, the
        anchor of its replicas' meetings), under ``"the strategy's own state"``.
        The module's buffers are rank 0's on every rank: a checkpoint holds rank 0's
        (`plait.core.TrainingSemantics.buffers`), which every rank loads.
        """
        taken = self.strategy.get_state_dict(self.module, [self.optimizer])
        own = {
            key: value
            for key, value in taken.items()
            if key not in ("state_dict", "optimizer_states")
        }
        inner = self.strategy.unwrap_module(self.module)
        zeros = self.strategy.broadcast(
            {name: _whole(buffer).cpu().clone() for name, buffer in inner.named_buffers()}, src=0
        )
        return {
            "module": _with_buffers(copied(taken.get("state_dict")), zeros),
            "optimizer": copied(taken.get("optimizer_states")),
            "the strategy's own state": copied(own),
            # The objects themselves, besides what the strategy says of them: a
            # strategy that saves a state without something would say the same of
            # the state it loads back.
            "module's tensors": _with_buffers(copied(inner.state_dict()), zeros),
            "optimizer's state": own_state(self.optimizer),
            "scheduler": copied(self.scheduler.state_dict() if self.scheduler else None),
            "random": copied(_random_state()),
            "loop": (self.progress.global_step, list(self.epoch_losses)),
        }


def _with_buffers(state: object, buffers: Mapping[str, torch.Tensor]) -> object:
    """``state`` (a module's state) with the entries of ``buffers`` in place of its own."""
    if not isinstance(state, Mapping) or not buffers:
        return state
    return {
        key: buffers.get(key, value) if isinstance(key, str) else value
        for key, value in state.items()
    }


def _whole(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter as a plain tensor (a DTensor's whole value: every rank calls it)."""
    if isinstance(parameter, torch.distributed.tensor.DTensor):
        whole: torch.Tensor = parameter.full_tensor()
        return whole.detach()
    return parameter.detach()


def shared_directory(strategy: Strategy, prefix: str) -> str:
    """A new directory rank 0 makes, named alike on every rank (every rank calls it)."""
    made = tempfile.mkdtemp(prefix=prefix) if strategy.global_rank == 0 else ""
    return strategy.broadcast(made, src=0)


@contextlib.contextmanager
def scratch_directory(strategy: Strategy) -> Iterator[str]:
    """A directory every rank names alike, removed by rank 0 once every rank is done.

    A rank whose work in it raised does not wait for the others: its error is the
    example's report, where a barrier the others never reach would hide it.
    """
    directory = shared_directory(strategy, "plait-kit-")
    try:
        yield directory
    except BaseException:
        if strategy.global_rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    strategy.barrier()
    if strategy.global_rank == 0:
        shutil.rmtree(directory, ignore_errors=True)


def seed_streams(run: TrainingRun, rank: int) -> None:
    """Seed this rank's random streams from the run's seed."""
    torch.manual_seed(run.seed * 7 + rank)
    random.seed(run.seed * 11 + rank)


def finish(strategy: Strategy) -> None:
    """Tear ``strategy`` down, whatever its teardown raises."""
    with contextlib.suppress(Exception):
        strategy.teardown()
