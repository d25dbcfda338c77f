"""A small decoder-only transformer that learns to continue repeating sequences.

Each sequence starts with `PERIOD` random tokens and then repeats them: a token
after the first period is the one `PERIOD` places before it, which a causal
attention layer finds by the tokens' positions. The data is made from a fixed seed
(nothing is downloaded); a model that learned the rule predicts every token after
the first period, so its next-token accuracy approaches ``1 - PERIOD / LENGTH``
(0.8125), where guessing gives ``1 / VOCABULARY``.

Under ``ModelParallelStrategy`` the model parallelizes itself in `configure_model`:
tensor parallelism over ``tp`` (attention heads and the MLP's width), context
parallelism over ``cp`` (every rank a slice of each sequence, attention through
`plait.strategies.context_parallel.context_parallel_attention`), then FSDP over
the strategy's ``data_parallel_mesh``; with pipeline ranks (``pp``), cut into
stages first (`Decoder.units`), each stage parallelized the same way. Under any
other strategy it runs whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import ConfigurationError, PipelineModule
from plait.strategies.whole_pipeline import WholePipeline
from plait.trainer.module import DataModule, Module

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["Decoder", "DecoderLM", "RepeatsData", "next_token_loss", "repeating_sequences"]

VOCABULARY: Final = 32
PERIOD: Final = 4
LENGTH: Final = 16  # tokens a sample is trained on: 2 x cp equal chunks, for cp up to 8


def repeating_sequences(count: int, seed: int) -> torch.Tensor:
    """``count`` sequences of ``LENGTH + 1`` tokens: `PERIOD` random ones, repeated."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randint(VOCABULARY, (count, PERIOD), generator=generator)
    repeats = -(-(LENGTH + 1) // PERIOD)
    return start.repeat(1, repeats)[:, : LENGTH + 1]


class RepeatsData(DataModule):
    """Repeating sequences: inputs are the first `LENGTH` tokens, targets the next ones.

    Args:
        batch_size: Sequences per batch on each data-parallel rank.
        train_size: Training sequences.
        val_size: Validation sequences (made from another seed).
    """

    def __init__(self, batch_size: int = 32, train_size: int = 2048, val_size: int = 256) -> None:
        self.batch_size = batch_size
        self.train_size = train_size
        self.val_size = val_size
        self._train: TensorDataset | None = None
        self._val: TensorDataset | None = None

    @staticmethod
    def _dataset(count: int, seed: int) -> TensorDataset:
        sequences = repeating_sequences(count, seed)
        return TensorDataset(sequences[:, :-1], sequences[:, 1:])

    @override
    def setup(self, stage: str) -> None:
        self._train = self._dataset(self.train_size, seed=0)
        self._val = self._dataset(self.val_size, seed=1)

    @override
    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        assert self._train is not None, "setup() runs first"
        return DataLoader(self._train, batch_size=self.batch_size, shuffle=True)

    @override
    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        assert self._val is not None, "setup() runs first"
        return DataLoader(self._val, batch_size=128)


class Attention(nn.Module):
    """Causal self-attention; its heads may be split over ``tp``, its tokens over ``cp``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.group: torch.distributed.ProcessGroup | None = None  # cp, set by configure_model

    @override
    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        from plait.strategies.context_parallel import context_parallel_attention  # noqa: PLC0415

        batch, length, _ = x.shape
        # (batch, heads, tokens, head_dim); under tensor parallelism, this rank's heads.
        q, k, v = (w(x).view(batch, length, -1, self.head_dim).transpose(1, 2) for w in (
            self.wq, self.wk, self.wv
        ))  # fmt: skip
        out = context_parallel_attention(
            q, k, v, group=self.group, positions=positions, is_causal=True
        )
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(batch, length, -1))
        return result


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = Attention(dim, heads)
        self.mlp_norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    @override
    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), positions)
        mlp: torch.Tensor = self.down(nn.functional.gelu(self.up(self.mlp_norm(x))))
        return x + mlp


class Decoder(nn.Module):
    """Token and position embeddings, `layers` blocks, a norm and the output head.

    A pipeline stage holds some of them, the others ``None``: `forward` runs the
    parts there are (`units` names them in the order it runs them).
    """

    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tokens: nn.Module | None = nn.Embedding(VOCABULARY, dim)
        self.positions: nn.Module | None = nn.Embedding(LENGTH, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm: nn.Module | None = nn.LayerNorm(dim)
        self.head: nn.Module | None = nn.Linear(dim, VOCABULARY)

    def units(self) -> list[str]:
        """The submodules in the order `forward` runs them: what pipeline stages cut."""
        blocks = [f"blocks.{index}" for index in range(len(self.blocks))]
        return ["tokens", "positions", *blocks, "norm", "head"]

    @override
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Next-token scores of ``tokens`` at the global ``positions`` (one per token).

        ``positions`` may be given per sample, ``(batch, tokens)`` (every row the
        same), as a pipeline passes it to each stage; a stage that does not hold the
        embeddings takes ``tokens`` as the hidden states of the stage before.
        """
        if positions.dim() == 2:
            positions = positions[0]
        h = self.tokens(tokens) if self.tokens is not None else tokens
        if self.positions is not None:
            h = h + self.positions(positions.to(tokens.device))
        for block in self.blocks:
            if block is not None:
                h = block(h, positions)
        if self.norm is not None:
            h = self.norm(h)
        return self.head(h) if self.head is not None else h


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every token's scores against the next token."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class DecoderLM(Module):
    """`Decoder` trained for the next token with AdamW.

    Args:
        dim: Width of the hidden states (a multiple of ``heads``).
        heads: Attention heads (a multiple of the tensor-parallel size).
        layers: Transformer blocks.
        lr: The learning rate.
    """

    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()  # DecoderLM.load_from_checkpoint makes it again
        self.lr = lr
        self.model: nn.Module = Decoder(dim, heads, layers)  # a Pipeline once cut

    @property
    def pipelined(self) -> bool:
        """Whether the model is cut into pipeline stages (the strategy has ``pp`` ranks)."""
        return isinstance(self.model, PipelineModule) and not isinstance(self.model, WholePipeline)

    @override
    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy``: cut into stages, split the heads and MLPs, shard.

        With pipeline ranks, the model is cut into stages (`Decoder.units`) and
        each of this rank's is parallelized as the whole model would be: tensor
        parallelism over ``tp`` (each rank its share of the heads and of the MLP's
        width), the attention over this rank's ``cp`` group, then FSDP per block and
        on the whole over the strategy's ``data_parallel_mesh`` (``dp_shard`` and
        ``cp`` together). Done once: a later run finds it done.
        """
        from plait.strategies.model_parallel import ModelParallelStrategy  # noqa: PLC0415

        strategy = self.trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, ModelParallelStrategy) and strategy.pipeline_parallel_size > 1:
            units = self.model.units() if isinstance(self.model, Decoder) else []
            self.model = self.pipeline(self.model, next_token_loss, units=units)
        parts = getattr(self.model, "parts", None) or [self.model]
        for part in parts:
            for block in part.blocks:
                if isinstance(block, Block):
                    block.attention.group = self.context_parallel_group  # None without cp
        mesh = self.device_mesh
        if mesh is None or not isinstance(strategy, ModelParallelStrategy):
            return  # no mesh: the strategy (DDP, FSDP, ...) takes the model whole
        from plait.strategies.mesh import is_dtensor  # noqa: PLC0415 (only on a mesh)

        if any(is_dtensor(p) for p in self.model.parameters()):
            return
        for part in parts:
            _parallelize(part, mesh, strategy.data_parallel_mesh, stage=self.pipelined)

    @override
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token scores of this rank's tokens (its slice of each sequence under cp)."""
        logits: torch.Tensor = self.model(tokens, self.sequence_positions(LENGTH))
        return logits

    def _pipelined_loss(self, batch: object) -> torch.Tensor:
        # The schedule runs the stages (forward and backward in training): the loss,
        # on every rank; the scores stay on the last stage's rank.
        assert isinstance(batch, list | tuple), "batches are (inputs, targets)"
        inputs, targets = (self.shard_sequence(part) for part in batch)
        positions = self.sequence_positions(LENGTH).expand(inputs.shape[0], -1)
        loss: torch.Tensor = self.model(inputs, target=targets, positions=positions)
        return loss

    def _loss_and_accuracy(self, batch: object) -> tuple[torch.Tensor, torch.Tensor]:
        assert isinstance(batch, list | tuple), "batches are (inputs, targets)"
        inputs, targets = (self.shard_sequence(part) for part in batch)
        logits = self(inputs)
        loss = next_token_loss(logits, targets)
        accuracy = (logits.argmax(dim=-1) == targets).float().mean()
        return loss, accuracy

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        if self.pipelined:
            loss = self._pipelined_loss(batch)
        else:
            loss, _ = self._loss_and_accuracy(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        if self.pipelined:  # no scores on most ranks: the loss alone
            self.log("val_loss", self._pipelined_loss(batch), prog_bar=True, sync_dist=True)
            return
        loss, accuracy = self._loss_and_accuracy(batch)
        self.log("val_loss", loss, sync_dist=True)
        self.log("val_acc", accuracy, prog_bar=True, sync_dist=True)

    @override
    def predict_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        """The predicted next tokens: this rank's slice of each sequence under cp."""
        if self.pipelined:
            raise ConfigurationError(
                "the decoder predicts whole: under a pipeline its scores are on the "
                "last stage's rank only",
                fix="predict in one process (plait predict --example decoder --ckpt-path "
                "...), which reads the pipeline's checkpoint whole",
            )
        tokens = batch[0] if isinstance(batch, list | tuple) else batch
        assert isinstance(tokens, torch.Tensor)
        predicted: torch.Tensor = self(self.shard_sequence(tokens)).argmax(dim=-1)
        return predicted

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def _parallelize(
    model: nn.Module, mesh: DeviceMesh, data_parallel: DeviceMesh, *, stage: bool
) -> None:
    # Tensor parallelism over tp (heads and the MLP's width), then FSDP per block and
    # on the whole over the data-parallel mesh; ``stage``: a pipeline stage's copy.
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    blocks = [block for block in getattr(model, "blocks", ()) if isinstance(block, Block)]
    if mesh["tp"].size() > 1:
        from torch.distributed.tensor.parallel import (  # noqa: PLC0415
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            "up": ColwiseParallel(),
            "down": RowwiseParallel(),
        }
        for block in blocks:
            parallelize_module(block, mesh["tp"], plan)
    # Under a pipeline the gathered parameters stay for the stage's microbatches.
    for module in (*blocks, model):
        if stage:
            fully_shard(module, mesh=data_parallel, reshard_after_forward=False)
        else:
            fully_shard(module, mesh=data_parallel)
