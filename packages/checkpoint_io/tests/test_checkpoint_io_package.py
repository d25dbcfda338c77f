import plait.checkpoint_io
from plait.core import CheckpointIORegistry


def test_the_package_registers_only_what_it_ships() -> None:
    # The package holds no checkpoint IO yet, so it must not register a name.
    assert plait.checkpoint_io.__doc__
    assert [
        entry.name
        for entry in CheckpointIORegistry.entries()
        if entry.source == "plait-checkpoint-io"
    ] == []
