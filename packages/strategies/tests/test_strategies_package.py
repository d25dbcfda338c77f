import plait.strategies
from plait.core import StrategyRegistry


def test_the_package_registers_only_what_it_ships() -> None:
    # The package holds no strategy yet, so it must not register a name.
    assert plait.strategies.__doc__
    assert [
        entry.name for entry in StrategyRegistry.entries() if entry.source == "plait-strategies"
    ] == []
