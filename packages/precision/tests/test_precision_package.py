import plait.precision
from plait.core import PrecisionRegistry


def test_the_package_registers_only_what_it_ships() -> None:
    # The package holds no precision plugin yet, so it must not register a name.
    assert plait.precision.__doc__
    assert [
        entry.name for entry in PrecisionRegistry.entries() if entry.source == "plait-precision"
    ] == []
