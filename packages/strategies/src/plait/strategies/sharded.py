"""DDP with the optimizer's state sharded across ranks (ZeRO stage 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from typing_extensions import override

from plait.strategies.ddp import DDPStrategy

if TYPE_CHECKING:
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from plait.core.typing import StateDict

__all__ = ["DDPShardedStrategy"]


def _zero_redundancy_optimizer() -> type[ZeroRedundancyOptimizer]:
    # Imported on first use: torch.distributed.optim is slow to import and warns
    # about torch.jit on import, which every user of plait.strategies would see.
    from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: PLC0415

    return ZeroRedundancyOptimizer


class DDPShardedStrategy(DDPStrategy):
    """DDP whose optimizers keep only this rank's share of their state.

    Each optimizer is replaced by a `torch.distributed.optim.ZeroRedundancyOptimizer`
    of the same class, hyper-parameters and parameter groups: every rank updates
    its share of the parameters and broadcasts them, so optimizer memory per rank
    falls by the world size while training gives the same result as DDP.

    Takes the arguments of `DDPStrategy`.
    """

    @override
    def setup_optimizers(
        self, optimizers: Sequence[torch.optim.Optimizer]
    ) -> list[torch.optim.Optimizer]:
        """Replace each optimizer by its sharded twin (made over the same parameters)."""
        return [self._shard(optimizer) for optimizer in optimizers]

    def _shard(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        zero = _zero_redundancy_optimizer()
        if isinstance(optimizer, zero):
            return optimizer
        groups = [
            {key: value for key, value in group.items() if key != "initial_lr"}
            for group in optimizer.param_groups
        ]
        return zero(
            groups,
            optimizer_class=type(optimizer),
            process_group=self.process_group,
            **optimizer.defaults,
        )

    @override
    def check_closure_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse: each rank steps its own partition, from which a closure's optimizer decides.

        Raises:
            ConfigurationError: Always, naming the optimizer and the fix.
        """
        self.refuse_closure_optimizer(
            optimizer,
            "DDPShardedStrategy partitions the optimizer: each rank would decide from its own part",
        )

    @override
    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> StateDict:
        """The whole optimizer state on rank 0 (gathered from every rank); empty elsewhere.

        With a checkpoint IO that every rank writes through (``"distributed"``), every
        rank holds the whole state: such an IO writes each value once, from one rank,
        and a rank that held none would leave the state without its structure.
        Every rank must call it: gathering the shards is collective.
        """
        if not isinstance(optimizer, _zero_redundancy_optimizer()):
            return optimizer.state_dict()
        optimizer.consolidate_state_dict(to=0)
        whole = optimizer.state_dict() if self.is_global_zero else {}
        if self.writes_collectively:
            return self.broadcast(whole, src=0)
        return whole
