"""The examples' models, data, optimizers and schedulers: alike on a rank and in the reference."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import torch
import torch.distributed.nn.functional
from torch import nn
from typing_extensions import override

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from plait.conformance.training.cases import TrainingRun

__all__ = [
    "CLASSES",
    "LENGTH",
    "STAGED",
    "Attention",
    "global_batch",
    "make_model",
    "make_optimizer",
    "make_scheduler",
    "micro_batch",
    "rank_rows",
    "step_scheduler",
]

CLASSES: Final = 3
_FEATURES: Final = 6
_TOKENS: Final = 11
LENGTH: Final = 4
"""The tokens of a sequence (the transformer block's and the attention's)."""


class _Layers(nn.Sequential):
    """Layers run in order; a pipeline stage's copy skips the other stages' (``None``)."""

    @override
    def forward(self, value: torch.Tensor) -> torch.Tensor:
        for layer in self._modules.values():
            if layer is not None:
                value = layer(value)
        return value


STAGED: Final = {"mlp": ("0", "1", "2"), "conv": ("0", "1", "2", "3")}
"""The models a pipeline cuts into stages, and their layers in the order they run."""


class _Pooled(nn.Module):
    """Embeds tokens, averages them, classifies: an embedding bag of plain layers."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(_TOKENS, 8)
        self.head = nn.Linear(8, CLASSES)

    @override
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.embedding(tokens).mean(dim=1))
        return out


class _Block(nn.Module):
    """One transformer encoder block over a short sequence, then a head.

    Without dropout, and without biases: the key projection's bias has no gradient but
    rounding, which Adam would make a step of its own on each rank.
    """

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.TransformerEncoderLayer(
            d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True, bias=False
        )
        self.head = nn.Linear(8, CLASSES)

    @override
    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.block(sequence).mean(dim=1))
        return out


class Attention(nn.Module):
    """Causal self-attention over a sequence, pooled, then a head: a sequence model.

    Its tokens may be split over context-parallel ranks: `attend` is then the
    strategy's attention (`plait.core.SupportsContextParallelAttention`) and the
    pooled sum is added up over `group`. Without biases before the attention (a key's
    bias has no gradient but rounding).
    """

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(8, 8, bias=False)
        self.key = nn.Linear(8, 8, bias=False)
        self.value = nn.Linear(8, 8, bias=False)
        self.out = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, CLASSES)
        self.attend: Callable[..., torch.Tensor] | None = None
        self.group: torch.distributed.ProcessGroup | None = None

    @override
    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        batch, length, width = sequence.shape
        query, key, value = (
            layer(sequence).view(batch, length, 2, width // 2).transpose(1, 2)
            for layer in (self.query, self.key, self.value)
        )
        if self.attend is None:
            mixed = nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
        else:
            mixed = self.attend(query, key, value, is_causal=True)
        total = self.out(mixed.transpose(1, 2).reshape(batch, length, width)).sum(dim=1)
        if self.group is not None:
            # The other ranks' tokens' sums: this rank's gradient flows back to them.
            total = torch.distributed.nn.functional.all_reduce(total, group=self.group)  # type: ignore[no-untyped-call]
        out: torch.Tensor = self.head(total / LENGTH)
        return out


def make_model(run: TrainingRun) -> nn.Module:
    """The run's model, its weights drawn from ``run.seed`` (the same everywhere)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(run.seed)
        if run.model == "mlp":
            return _Layers(nn.Linear(_FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES))
        if run.model == "conv":
            return _Layers(
                nn.Conv2d(2, 3, kernel_size=3),
                nn.ReLU(),
                nn.Flatten(),
                nn.Linear(3 * 4 * 4, CLASSES),
            )
        if run.model == "embedding":
            return _Pooled()
        if run.model == "attention":
            return Attention()
        if run.model == "norm":
            # Buffers: the running mean and variance each rank updates from its own
            # micro-batches, and the batches counted. No bias before the norm: it has
            # no gradient but rounding, which Adam would make a step of its own.
            return nn.Sequential(
                nn.Linear(_FEATURES, 8, bias=False),
                nn.BatchNorm1d(8),
                nn.Tanh(),
                nn.Linear(8, CLASSES),
            )
        return _Block()


def _inputs(run: TrainingRun, count: int, generator: torch.Generator) -> torch.Tensor:
    if run.model in ("mlp", "norm"):
        return torch.randn(count, _FEATURES, generator=generator)
    if run.model == "conv":
        return torch.randn(count, 2, 6, 6, generator=generator)
    if run.model == "embedding":
        return torch.randint(0, _TOKENS, (count, 5), generator=generator)
    return torch.randn(count, LENGTH, 8, generator=generator)


def global_batch(run: TrainingRun, world_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples of optimizer step ``step``: every rank's micro-batches, in order.

    An epoch's samples are drawn once from the seed; each epoch takes them in an order
    of its own, so a run that resumes inside an epoch must find its place in it.
    """
    size = run.accumulate * world_size * run.micro_batch
    generator = torch.Generator().manual_seed(run.seed)
    count = size * run.steps_per_epoch
    inputs = _inputs(run, count, generator)
    targets = torch.randint(0, CLASSES, (count,), generator=generator)
    epoch, index = divmod(step, run.steps_per_epoch)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(run.seed + 1 + epoch))
    chosen = order[index * size : (index + 1) * size]
    return inputs[chosen], targets[chosen]


def micro_batch(
    run: TrainingRun, world_size: int, rank: int, step: int, window: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch ``window`` of step ``step``."""
    inputs, targets = global_batch(run, world_size, step)
    start = _start(run, world_size, rank, window)
    return inputs[start : start + run.micro_batch], targets[start : start + run.micro_batch]


def rank_rows(run: TrainingRun, world_size: int, rank: int) -> list[int]:
    """The rows of a step's global batch that rank ``rank`` trains on, window by window."""
    return [
        index
        for window in range(run.accumulate)
        for start in [_start(run, world_size, rank, window)]
        for index in range(start, start + run.micro_batch)
    ]


def _start(run: TrainingRun, world_size: int, rank: int, window: int) -> int:
    """Where rank ``rank``'s micro-batch ``window`` starts in a step's global batch."""
    return (window * world_size + rank) * run.micro_batch


def make_optimizer(run: TrainingRun, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The run's optimizer over ``parameters``."""
    if run.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)
    if run.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=0.01)
    # No early stop: whether one would come depends on the rounding of a sum, and a
    # run that stops an iteration sooner is not comparable with one that does not.
    return torch.optim.LBFGS(
        parameters, lr=0.1, max_iter=3, history_size=4, tolerance_grad=0.0, tolerance_change=0.0
    )


Scheduler = torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau


def make_scheduler(run: TrainingRun, optimizer: torch.optim.Optimizer) -> Scheduler | None:
    """The run's learning-rate scheduler of ``optimizer``, if it has one."""
    if run.scheduler == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    if run.scheduler == "epoch":
        return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    if run.scheduler == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
    return None


def step_scheduler(
    run: TrainingRun, scheduler: Scheduler | None, step: int, epoch_losses: list[float]
) -> None:
    """Step ``scheduler`` after optimizer step ``step`` (counted from 0), as the run says.

    ``epoch_losses`` are the losses of the epoch's steps so far: a plateau scheduler
    reads their mean at the epoch's end.
    """
    if scheduler is None:
        return
    if run.scheduler == "step":
        assert not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        scheduler.step()
        return
    if (step + 1) % run.steps_per_epoch:
        return  # not an epoch's end
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(sum(epoch_losses) / len(epoch_losses))
    else:
        scheduler.step()
