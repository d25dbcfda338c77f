"""A strategy from another distribution is found through the plait.strategies entry points."""

import torch

from plait.core import Strategy, StrategyRegistry


def test_an_installed_third_party_strategy_is_found_by_name() -> None:
    entry = StrategyRegistry.entry("Example_Strategy")
    strategy = StrategyRegistry.get("example_strategy")

    assert entry.source == "plait-example-strategy"
    assert entry.description == "a third party's strategy"
    assert isinstance(strategy, Strategy)
    assert strategy.greeting() == "hello from cpu"  # type: ignore[attr-defined]
    assert strategy.reduce(torch.tensor([1, 2]), reduce_op="mean").dtype == torch.float32
