"""What a Module's context-parallel helpers give, with and without a strategy that splits
sequences, where ``sync_dist`` folds values under context parallelism, and the decoder
example in one process.

The decoder split over cp and tp ranks runs in ``tests/test_cli.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pytest
import torch

from plait.core import ProcessLayout, SupportsContextParallel
from plait.strategies.context_parallel import sequence_positions, shard_sequence
from plait.trainer import Module
from plait.trainer.cli import _strategy, build_parser
from plait.trainer.examples.decoder import (
    LENGTH,
    PERIOD,
    VOCABULARY,
    DecoderLM,
    repeating_sequences,
)
from plait.trainer.metrics import metric_group

if TYPE_CHECKING:
    from plait.trainer.trainer import Trainer


class _HalfOfEachSequence:
    """A strategy's context-parallel side, as cp rank 1 of 2 sees it."""

    context_parallel_group = None

    def sequence_positions(self, length: int) -> torch.Tensor:
        return sequence_positions(length, rank=1, size=2)

    def shard_sequence(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return shard_sequence(tensor, rank=1, size=2, dim=dim)


class _Attached:
    strategy = _HalfOfEachSequence()


def test_without_a_strategy_that_splits_sequences_a_module_holds_them_whole() -> None:
    module = Module()
    tokens = torch.arange(12).view(2, 6)
    assert module.context_parallel_group is None
    assert module.sequence_positions(6).tolist() == list(range(6))
    assert module.shard_sequence(tokens) is tokens


def test_under_one_that_does_a_module_takes_its_tokens_and_their_positions() -> None:
    assert isinstance(_HalfOfEachSequence(), SupportsContextParallel)
    module = Module()
    module.trainer = cast("Trainer", _Attached())
    tokens = torch.arange(16).view(2, 8)
    # cp rank 1 of 2, load-balanced: chunks 1 and 2 of 4.
    assert module.sequence_positions(8).tolist() == [2, 3, 4, 5]
    assert module.shard_sequence(tokens).tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]


@pytest.mark.parametrize(
    ("sizes", "group"),
    [
        ({"data_parallel_size": 4}, None),
        ({"data_parallel_size": 2, "dimensions": {"tp": 2}}, "data_parallel"),
        # The ranks of a cp group hold different tokens: they fold with the dp ranks.
        ({"data_parallel_size": 2, "dimensions": {"cp": 2}}, None),
        ({"data_parallel_size": 1, "dimensions": {"cp": 2, "tp": 2}}, "dp_cp"),
        ({"data_parallel_size": 2, "dimensions": {"cp": 1, "tp": 2}}, "data_parallel"),
    ],
)
def test_sync_dist_folds_over_the_ranks_that_hold_different_tokens(
    sizes: dict[str, object], group: str | None
) -> None:
    layout = ProcessLayout(world_size=4, global_rank=0, **sizes)  # type: ignore[arg-type]
    assert metric_group(layout) == group


def test_the_decoder_learns_its_sequences_only_from_earlier_tokens() -> None:
    sequences = repeating_sequences(8, seed=3)
    assert sequences.shape == (8, LENGTH + 1)
    assert int(sequences.max()) < VOCABULARY
    assert torch.equal(sequences[:, PERIOD:], sequences[:, :-PERIOD])  # it repeats
    torch.manual_seed(0)
    module = DecoderLM(dim=16, heads=2, layers=1)
    tokens = sequences[:, :-1]
    logits = module(tokens)
    assert logits.shape == (8, LENGTH, VOCABULARY)
    # Causal: changing the last token leaves every earlier token's scores as they were.
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCABULARY
    torch.testing.assert_close(module(changed)[:, :-1], logits[:, :-1])


def test_a_context_parallel_size_for_a_strategy_without_one_is_refused_with_the_fix() -> None:
    from plait.core import ConfigurationError  # noqa: PLC0415

    arguments = build_parser().parse_args(
        ["fit", "--example", "decoder", "--strategy", "ddp", "--context-parallel-size", "2"]
    )
    with pytest.raises(ConfigurationError) as caught:
        _strategy(arguments)
    assert "--context-parallel-size 2 was given, and the strategy 'ddp' splits no sequence" in (
        str(caught.value)
    )
    assert "--strategy model_parallel --context-parallel-size 2" in str(caught.value)
    flags = ["--strategy", "model_parallel", "--context-parallel-size", "2"]
    made = _strategy(build_parser().parse_args(["fit", "--example", "decoder", *flags]))
    assert getattr(made, "context_parallel_size", None) == 2
