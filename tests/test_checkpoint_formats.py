"""Checkpoint formats by name: the built-in ones, and a third party's, read by every strategy.

The example plugin (``tests/plugins/example_strategy``) registers ``example_json``
through the ``plait.checkpoint_formats`` entry point; nothing in plait names it.
`tests/test_own_loop.py` moves its weights into FSDP's shards and ZeRO's partitions
across processes; here, the rules in one process.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch import nn

from plait.core import (
    CheckpointError,
    CheckpointFormat,
    CheckpointFormatRegistry,
    detect_checkpoint_format,
)
from plait.strategies import SingleDeviceStrategy, consolidate_checkpoint
from plait.strategies.export import read_whole


def _json_checkpoint(path: Path, module: nn.Module, **entries: object) -> None:
    plugin = importlib.import_module("plait_example_strategy")
    plugin.write_json(module.state_dict(), entries, path)


def test_the_built_in_formats_and_a_third_partys_are_registered_by_their_packages() -> None:
    names = {"file", "distributed", "deepspeed", "example_json"}
    assert names <= set(CheckpointFormatRegistry.available())
    for name in names:
        built = CheckpointFormatRegistry.get(name)
        assert isinstance(built, CheckpointFormat)
        assert built.name == name
    assert CheckpointFormatRegistry.entry("example_json").source == "plait-example-strategy"


def test_a_third_partys_format_is_read_consolidated_and_loaded_by_a_strategy(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    source = nn.Linear(3, 2)
    _json_checkpoint(tmp_path / "json", source, step=5)
    found = detect_checkpoint_format(tmp_path / "json")
    assert found is not None
    assert found.name == "example_json"

    consolidate_checkpoint(tmp_path / "json", tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert whole["step"] == 5
    assert torch.equal(whole["state_dict"]["weight"], source.weight)
    assert read_whole(tmp_path / "json")["step"] == 5

    strategy = SingleDeviceStrategy("cpu")
    layer = nn.Linear(3, 2)
    model = strategy.setup_module(layer)
    left = strategy.load_checkpoint(tmp_path / "json", model)
    assert torch.equal(layer.weight, source.weight)
    assert left == {"step": 5}
    strategy.teardown()


def test_a_format_without_optimizer_state_loads_with_a_fresh_optimizer_only_when_asked(
    tmp_path: Path,
) -> None:
    _json_checkpoint(tmp_path / "json", nn.Linear(3, 2), step=5)
    strategy = SingleDeviceStrategy("cpu")
    layer = nn.Linear(3, 2)
    model, [optimizer] = strategy.setup_module_and_optimizers(
        layer, [torch.optim.Adam(layer.parameters(), lr=0.1)]
    )
    state: dict[str, object] = {"model": model, "optimizer": optimizer, "step": 0}

    with pytest.raises(CheckpointError, match="holds no optimizer state") as raised:
        strategy.load_checkpoint(tmp_path / "json", state)
    assert "weights_only=True" in str(raised.value.fix)
    assert state == {"model": model, "optimizer": optimizer, "step": 0}  # nothing restored

    left = strategy.load_checkpoint(tmp_path / "json", state, weights_only=True)
    assert left == {}
    assert state == {"model": model, "optimizer": optimizer, "step": 5}
    strategy.teardown()


def test_a_path_of_no_registered_format_is_refused_listing_the_formats(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()

    with pytest.raises(CheckpointError, match="no registered format") as raised:
        consolidate_checkpoint(tmp_path / "notes", tmp_path / "out.pt")
    assert "deepspeed, distributed, example_json, file" in str(raised.value)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_whole(tmp_path / "missing")
