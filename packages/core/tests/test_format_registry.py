"""The checkpoint format registry: formats found by what a path holds, one format a path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from plait.core import (
    CheckpointError,
    CheckpointFormat,
    CheckpointFormatRegistry,
    ConfigurationError,
    detect_checkpoint_format,
)

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike


class MarkerFormat:
    """A directory holding a marker file of the format's name."""

    def __init__(self, name: str = "marker", marker: str = "MARKER") -> None:
        self._name = name
        self.marker = marker

    @property
    def name(self) -> str:
        return self._name

    def recognizes(self, path: PathLike) -> bool:
        return (Path(path) / self.marker).is_file()

    def read_whole(self, path: PathLike, *, optimizers: bool = True) -> Checkpoint:
        return {"state_dict": {}, "optimizers": optimizers}

    def consolidate(self, path: PathLike, output: PathLike, *, weights_only: bool = False) -> None:
        Path(output).write_text(self._name)


@pytest.fixture
def registered() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        CheckpointFormatRegistry.remove(name)


def test_a_path_is_of_the_one_format_that_recognises_it(
    tmp_path: Path, registered: list[str]
) -> None:
    assert isinstance(MarkerFormat(), CheckpointFormat)
    CheckpointFormatRegistry.register("marker", MarkerFormat)
    registered.append("marker")
    (tmp_path / "MARKER").write_text("")

    found = detect_checkpoint_format(tmp_path)

    assert found is not None
    assert found.name == "marker"
    assert detect_checkpoint_format(tmp_path / "nothing") is None


def test_two_formats_that_recognise_one_path_are_named_not_guessed(
    tmp_path: Path, registered: list[str]
) -> None:
    CheckpointFormatRegistry.register("marker", MarkerFormat)
    CheckpointFormatRegistry.register("marker_too", MarkerFormat, name="marker_too")
    registered.extend(["marker", "marker_too"])
    (tmp_path / "MARKER").write_text("")

    with pytest.raises(CheckpointError, match="more than one checkpoint format") as raised:
        detect_checkpoint_format(tmp_path)

    assert "'marker', 'marker_too'" in str(raised.value)
    assert raised.value.fix is not None
    assert "recognizes()" in raised.value.fix


def test_a_format_without_the_protocols_methods_is_refused_naming_them() -> None:
    class Half:
        name = "half"

        def recognizes(self, path: PathLike) -> bool:
            return False

    with pytest.raises(ConfigurationError) as raised:
        CheckpointFormatRegistry.register("half", Half)

    assert "consolidate" in str(raised.value)
    assert "read_whole" in str(raised.value)
    assert "half" not in CheckpointFormatRegistry
