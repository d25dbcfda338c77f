import plait.environments
from plait.core import EnvironmentRegistry


def test_the_package_registers_only_what_it_ships() -> None:
    # The package holds no cluster environment yet, so it must not register a name.
    assert plait.environments.__doc__
    assert [
        entry.name
        for entry in EnvironmentRegistry.entries()
        if entry.source == "plait-environments"
    ] == []
