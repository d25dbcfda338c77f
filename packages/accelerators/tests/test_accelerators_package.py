import plait.accelerators
from plait.core import AcceleratorRegistry


def test_the_package_registers_only_what_it_ships() -> None:
    # The package holds no accelerator yet, so it must not register a name.
    assert plait.accelerators.__doc__
    assert [
        entry.name
        for entry in AcceleratorRegistry.entries()
        if entry.source == "plait-accelerators"
    ] == []
