"""A strategy of your own: local SGD (and DiLoCo), declared and proven by plait's kit.

Each rank trains its own replica of the module on its own data, with its own
optimizer, and does not synchronise at every step: every ``sync_every`` optimizer
steps the replicas meet. The last meeting's module (the anchor) takes an outer SGD
step whose gradient is the replicas' mean change since then (``outer_lr=1`` and no
momentum: the mean of the replicas; DiLoCo: ``outer_lr=0.7, outer_momentum=0.9,
nesterov=True`` with an inner AdamW), and every replica starts again from it.

It is plait's `DDPStrategy` (its launcher, process group and collectives) without
the DDP wrapper, and four things of its own:

- ``optimizer_step`` counts the steps and meets the replicas every ``sync_every``;
- ``on_train_end`` meets them over what is left of a period, so that training ends
  with one module (the Trainer calls it; a loop of your own calls it after its last
  step), and ``on_validation_start``/``on_validation_end`` validate the replicas'
  mean without changing training;
- ``get_state_dict``/``set_state_dict`` carry every rank's replica and optimizer
  state (they differ between meetings, and a checkpoint IO writes rank 0's state
  alone, or refuses values the ranks do not agree on), the anchor, the outer
  momentum and the step count: a resumed run goes on bit for bit;
- ``training_semantics`` declares `PeriodicAveraging`, which
  `plait.conformance.TrainingSuite` proves (``tests/test_training_kit.py``).

Train with it like with any strategy::

    python examples/local_sgd.py --processes 2 --steps 40
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from plait.core import (
    CheckpointError,
    ConfigurationError,
    PeriodicAveraging,
    TrainingSemantics,
)
from plait.strategies import DDPStrategy

if TYPE_CHECKING:
    from plait.core.training import OuterOptimizer, OuterScheduler
    from plait.core.typing import Checkpoint

_KEY = "local_sgd"


def _whole(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigurationError(
            f"{name}={value!r} must be a whole number, {least} or more",
            value=value,
            fix=f"pass e.g. {name}=4",
        )
    return value


class LocalSGDStrategy(DDPStrategy):
    """Replicas on their own data, meeting every ``sync_every`` steps (local SGD, DiLoCo).

    Args:
        sync_every: Optimizer steps between meetings.
        outer_lr: The outer SGD step's learning rate (1: the replicas' mean).
        outer_momentum: Its momentum (0: none).
        nesterov: Whether the momentum is Nesterov's.
        outer_optimizer: Instead of the outer SGD, a factory of the outer optimizer
            over the anchor's parameters (a module-level function: AdamW, ...).
        outer_scheduler: A factory of its scheduler, stepped after each outer step.
        fragments: Streaming synchronisation: the parameters split into this many
            fragments, whose meetings are staggered over the period.
        periods: A period per parameter group instead: the parameters split into
            ``len(periods)`` groups in order, group ``i`` meeting every
            ``periods[i]`` steps (``sync_every`` is then the longest of them).
        accelerator: As `DDPStrategy`'s; so are the other arguments.
        parallel_devices: The device of each local rank.
        cluster_environment: Where this process sits, or its name.
        precision: The precision plugin, or its name.
        checkpoint_io: The checkpoint IO, or its name.
        start_method: How the launcher starts the ranks (``"popen"``, ``"spawn"``, ...).
        timeout: How long a collective waits for the other ranks.

    Raises:
        ConfigurationError: ``sync_every`` is not a whole number of 1 or more, an
            outer setting is negative, or an outer optimizer is given with them.
    """

    def __init__(
        self,
        *,
        sync_every: int = 4,
        outer_lr: float = 1.0,
        outer_momentum: float = 0.0,
        nesterov: bool = False,
        outer_optimizer: OuterOptimizer | None = None,
        outer_scheduler: OuterScheduler | None = None,
        fragments: int = 1,
        periods: Sequence[int] = (),
        accelerator: str | None = None,
        parallel_devices: Sequence[torch.device] | None = None,
        cluster_environment: str | None = None,
        precision: str | None = None,
        checkpoint_io: str | None = None,
        start_method: str = "popen",
        timeout: timedelta = timedelta(minutes=30),
    ) -> None:
        self.sync_every = _whole("sync_every", sync_every, 1)
        self.averaging = PeriodicAveraging(
            every=self.sync_every,
            outer_lr=outer_lr,
            outer_momentum=outer_momentum,
            nesterov=nesterov,
            validates="mean",
            outer_optimizer=outer_optimizer,
            outer_scheduler=outer_scheduler,
            fragments=fragments,
            periods=tuple(periods),
        )
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision=precision,
            checkpoint_io=checkpoint_io,
            start_method=start_method,
            timeout=timeout,
        )
        self.steps = 0
        """Optimizer steps taken in the run (a checkpoint holds it)."""
        self._parameters: list[torch.nn.Parameter] = []
        self._anchor: list[torch.Tensor] = []
        self._momentum: list[torch.Tensor] = []
        self._validating: list[torch.Tensor] = []
        self._outer: torch.optim.Optimizer | None = None
        self._outer_schedule: torch.optim.lr_scheduler.LRScheduler | None = None

    @property
    @override
    def training_semantics(self) -> TrainingSemantics:
        """Replicas meeting every ``sync_every`` steps and validating their mean.

        A resume is bit for bit.
        """
        return TrainingSemantics(replicas=self.averaging, exact_resume=True)

    # The replicas: no DDP wrapper, so backward never synchronises.

    @override
    def configure_ddp(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module itself: each rank's gradients stay its own."""
        return module

    @override
    def setup_module_and_optimizers(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> tuple[torch.nn.Module, list[torch.optim.Optimizer]]:
        """Set up as DDP does, and take the replicas' starting point (the anchor)."""
        module, prepared = super().setup_module_and_optimizers(module, optimizers)
        self._parameters = list(self.unwrap_module(module).parameters())
        self._anchor = [parameter.detach().clone() for parameter in self._parameters]
        self._momentum = self._zero_momentum()
        self.steps = 0
        self._make_outer()
        return module, prepared

    def _zero_momentum(self) -> list[torch.Tensor]:
        """The outer momentum before any meeting (none without momentum)."""
        if not self.averaging.outer_momentum:
            return []
        return [torch.zeros_like(anchor) for anchor in self._anchor]

    def _make_outer(self) -> None:
        """The declared outer optimizer (and scheduler) over the anchor, as parameters."""
        make, schedule = self.averaging.outer_optimizer, self.averaging.outer_scheduler
        if make is None:
            return
        self._anchor = [torch.nn.Parameter(anchor) for anchor in self._anchor]
        self._outer = make(self._anchor)  # type: ignore[arg-type]
        self._outer_schedule = schedule(self._outer) if schedule is not None else None

    @override
    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: object | None = None
    ) -> object:
        """Step this rank's optimizer; meet the fragments whose turn it is.

        Without fragments, every ``sync_every``-th step.
        """
        result = super().optimizer_step(optimizer, closure)  # type: ignore[arg-type]
        self.steps += 1
        meeting = self._fragments(lambda fragment: self.averaging.meets(fragment, self.steps))
        if meeting:
            self.meet(meeting)
        return result

    def _fragments(self, chosen: Callable[[int], bool]) -> set[int]:
        return {fragment for fragment in range(self.averaging.parts) if chosen(fragment)}

    def _indices(self, fragments: Collection[int] | None) -> list[int]:
        """The parameters of ``fragments`` (of every one where None), by index."""
        count = len(self._parameters)
        return [
            index
            for index in range(count)
            if fragments is None or self.averaging.fragment(index, count) in fragments
        ]

    def _mean(self, indices: Sequence[int]) -> list[torch.Tensor]:
        """The replicas' mean of the parameters ``indices``, in one reduce."""
        chosen = [self._parameters[index] for index in indices]
        flat = torch.cat([parameter.detach().reshape(-1) for parameter in chosen])
        mean = self.reduce(flat, reduce_op="mean")
        means, start = [], 0
        for parameter in chosen:
            means.append(mean[start : start + parameter.numel()].view_as(parameter))
            start += parameter.numel()
        return means

    def meet(self, fragments: Collection[int] | None = None) -> None:
        """Every rank: the anchor of ``fragments`` (all where None) takes the outer step.

        Every replica's parameters of those fragments start again from it.
        """
        averaging = self.averaging
        indices = self._indices(fragments)
        means = dict(zip(indices, self._mean(indices), strict=True))
        if self._outer is not None:
            for index, anchor in enumerate(self._anchor):
                mean = means.get(index)
                anchor.grad = None if mean is None else anchor.detach() - mean
            self._outer.step()
            self._outer.zero_grad()
            if self._outer_schedule is not None:
                self._outer_schedule.step()
            with torch.no_grad():
                for index in indices:
                    self._parameters[index].copy_(self._anchor[index])
            return
        with torch.no_grad():
            for index in indices:
                anchor = self._anchor[index]
                update = anchor - means[index]
                if averaging.outer_momentum:
                    buffer = self._momentum[index] * averaging.outer_momentum + update
                    self._momentum[index] = buffer
                    update = (
                        update + averaging.outer_momentum * buffer if averaging.nesterov else buffer
                    )
                anchor.sub_(averaging.outer_lr * update)
                self._parameters[index].copy_(anchor)

    # Where a run is.

    @override
    def on_train_end(self) -> None:
        """Training ends with one module: the fragments that did not just meet meet."""
        left = self._fragments(lambda fragment: not self.averaging.meets(fragment, self.steps))
        if left:
            self.meet(left)

    @override
    def on_validation_start(self) -> None:
        """Validate the replicas' mean; training's replicas are kept aside."""
        if not self._parameters:
            return
        with torch.no_grad():
            self._validating = [parameter.detach().clone() for parameter in self._parameters]
            means = self._mean(range(len(self._parameters)))
            for parameter, mean in zip(self._parameters, means, strict=True):
                parameter.copy_(mean)

    @override
    def on_validation_end(self) -> None:
        """Put training's replicas back."""
        with torch.no_grad():
            for parameter, kept in zip(self._parameters, self._validating, strict=True):
                parameter.copy_(kept)
        self._validating = []

    # State: every rank's replica travels, not rank 0's alone.

    @override
    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        """Rank 0's replica and optimizer state, with every rank's beside them.

        ``"state_dict"`` and ``"optimizer_states"`` are rank 0's on every rank (what a
        plain module loads; a checkpoint IO that writes once, from one rank, needs the
        ranks to agree); the ``"local_sgd"`` entry holds each rank's (every rank
        gathers them), the anchor, the outer momentum and the step count.
        """
        state = super().get_state_dict(module, optimizers)
        # This rank's own module state: DDP's holds rank 0's buffers on every rank.
        own = self.module_state_dict(module)
        mine = {"module": own, "optimizer_states": state["optimizer_states"]}
        replicas = [self.broadcast(mine, src=rank) for rank in range(self.world_size)]
        state["state_dict"] = replicas[0]["module"]
        state["optimizer_states"] = replicas[0]["optimizer_states"]
        state[_KEY] = {
            "replicas": replicas,
            "anchor": [anchor.detach().clone() for anchor in self._anchor],
            "momentum": [buffer.clone() for buffer in self._momentum],
            "outer": None
            if self._outer is None
            else {
                "optimizer": self._outer.state_dict(),
                "scheduler": None
                if self._outer_schedule is None
                else self._outer_schedule.state_dict(),
            },
            "steps": self.steps,
            "world_size": self.world_size,
        }
        return state

    @override
    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        """Load this rank's replica (and with optimizers, the rest of the run).

        A checkpoint of another strategy (without ``"local_sgd"``) loads as DDP's, and
        the replicas start from it.

        Raises:
            CheckpointError: The checkpoint holds the replicas of another world size.
        """
        extra = state.get(_KEY)
        if not isinstance(extra, Mapping):
            super().set_state_dict(module, optimizers, state, source=source)
            self._anchor = [parameter.detach().clone() for parameter in self._parameters]
            self._make_outer()  # over the new anchor, afresh: that checkpoint has none
            return
        saved = extra["world_size"]
        if saved != self.world_size:
            raise CheckpointError(
                str(source),
                f"holds the replicas of {saved} ranks, and this run has {self.world_size}",
                fix="resume at the same world size, or load the weights alone "
                "(weights_only=True: rank 0's replica)",
            )
        mine = extra["replicas"][self.global_rank]
        own = {**state, "state_dict": mine["module"], "optimizer_states": mine["optimizer_states"]}
        super().set_state_dict(module, optimizers, own, source=source)
        if optimizers:
            self._anchor = [torch.as_tensor(anchor).clone() for anchor in extra["anchor"]]
            self._momentum = [torch.as_tensor(buffer).clone() for buffer in extra["momentum"]]
            if not self._momentum:  # a checkpoint without it: no meeting yet
                self._momentum = self._zero_momentum()
            self.steps = int(extra["steps"])
            self._make_outer()
            outer = extra.get("outer")
            if self._outer is not None and isinstance(outer, Mapping):
                self._outer.load_state_dict(outer["optimizer"])
                if self._outer_schedule is not None:
                    self._outer_schedule.load_state_dict(outer["scheduler"])


def train(strategy: LocalSGDStrategy, steps: int) -> float:
    """Fit a line on each rank's share of the data; the final loss, on every rank."""
    torch.manual_seed(0)
    line = torch.nn.Linear(4, 1)
    sgd = torch.optim.SGD(line.parameters(), lr=0.05)
    model, [optimizer] = strategy.setup_module_and_optimizers(line, [sgd])
    generator = torch.Generator().manual_seed(1 + strategy.global_rank)
    weights = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    loss = torch.zeros(())
    for _ in range(steps):
        inputs = torch.randn(16, 4, generator=generator)
        output = strategy.training_step(model, inputs)
        assert isinstance(output, torch.Tensor)
        loss = torch.nn.functional.mse_loss(output, inputs @ weights)
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
    strategy.on_train_end()
    return float(strategy.reduce(loss.detach(), reduce_op="mean"))


def _run(strategy: LocalSGDStrategy, steps: int) -> None:
    strategy.setup_environment()
    loss = train(strategy, steps)
    if strategy.is_global_zero:
        print(f"final loss {loss:.4f} on {strategy.world_size} processes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--start-method", default="popen", help="how the ranks start")
    arguments = parser.parse_args()
    local_sgd = LocalSGDStrategy(
        sync_every=4,
        accelerator="cpu",
        parallel_devices=[torch.device("cpu")] * arguments.processes,
        start_method=arguments.start_method,
    )
    local_sgd.launcher.launch(_run, local_sgd, arguments.steps)
