"""ZeRO's partitions rebuilt whole, and whole states checked before they are partitioned.

The directories here are written as DeepSpeed's engine lays them out (the real ones
are read and written by the own-loop test's moves): at stages 1 and 2 each
parameter group flat, end to end, split evenly between the ranks and padded at the
end of the last rank's part (saved without that padding); at stage 3 each parameter
split on its own, padded to a multiple of the world size. World size 3 pads every
parameter whose size it does not divide. Nothing here joins a process group.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from plait.core import CheckpointError
from plait.strategies.deepspeed.checkpoint_io import PARAMETER_NAMES
from plait.strategies.deepspeed.export import (
    checkpoint_layout,
    consolidate,
    optimizer_state_dict,
)
from plait.strategies.deepspeed.whole_state import set_optimizer_state

SHAPES = OrderedDict(
    [("module.0.weight", torch.Size([4, 5])), ("module.0.bias", torch.Size([4])),
     ("module.2.weight", torch.Size([1, 4])), ("module.2.bias", torch.Size([1]))]
)  # fmt: skip
TAG = "checkpoint-1"
GROUP = {"lr": 0.5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}


def _whole(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}


def _write(
    root: Path, stage: int, world_size: int, *, elastic: bool = False
) -> dict[str, dict[str, torch.Tensor]]:
    """A checkpoint of ``stage`` at ``world_size``: the weights and Adam's two moments."""
    values = {key: _whole(seed) for seed, key in enumerate(("fp32", "exp_avg", "exp_avg_sq"))}
    folder = root / TAG
    folder.mkdir(parents=True)
    (root / "latest").write_text(TAG)
    model_states = {
        "module": {name: tensor.to(torch.bfloat16) for name, tensor in values["fp32"].items()},
        "param_shapes": [SHAPES],
        "dp_world_size": world_size,
        "ds_config": {"zero_optimization": {"stage": stage}},
        "step": 7,
        "plait_client_keys": ["step"],
    }
    if stage == 3:
        for rank in range(world_size):
            torch.save(model_states, folder / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
    else:
        torch.save(model_states, folder / "mp_rank_00_model_states.pt")
    for rank in range(world_size):
        parts = {key: _part(stage, world_size, rank, whole) for key, whole in values.items()}
        flat = parts.pop("fp32")
        state = {0: {"step": torch.tensor(3.0), **parts}}
        if stage == 3:
            saved = {
                "zero_stage": 3,
                "optimizer_state_dict": {
                    "state": state,
                    "param_groups": [{**GROUP, "params": [0]}],
                },
                "fp32_flat_groups": [flat],
            }
        else:
            lean = flat.numel()
            padded = {key: torch.nn.functional.pad(part, (0, 2)) for key, part in parts.items()}
            base: object = {
                "state": {0: {"step": torch.tensor(3.0), **padded}},
                "param_groups": [{**GROUP, "params": [0]}],
            }
            if elastic:
                base = [{"step": 3, **parts}]
            saved = {
                "zero_stage": stage,
                "base_optimizer_state": base,
                "single_partition_of_fp32_groups": [flat[:lean]],
            }
        torch.save(
            {"optimizer_state_dict": saved},
            folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
        )
    return values


def _part(stage: int, world_size: int, rank: int, whole: dict[str, torch.Tensor]) -> torch.Tensor:
    if stage == 3:
        pieces = []
        for tensor in whole.values():
            share = math.ceil(tensor.numel() / world_size)
            padded = torch.nn.functional.pad(
                tensor.reshape(-1), (0, share * world_size - tensor.numel())
            )
            pieces.append(padded.narrow(0, share * rank, share))
        return torch.cat(pieces)
    flat = torch.cat([tensor.reshape(-1) for tensor in whole.values()])
    share = math.ceil(flat.numel() / world_size)
    return torch.nn.functional.pad(flat, (0, share * world_size - flat.numel()))[
        share * rank : share * (rank + 1)
    ][: max(0, min(share, flat.numel() - share * rank))]


@pytest.mark.parametrize(("stage", "world_size"), [(1, 2), (2, 3), (3, 2), (3, 3)])
def test_the_optimizer_state_is_rebuilt_whole_per_parameter_with_the_users_names(
    tmp_path: Path, stage: int, world_size: int
) -> None:
    values = _write(tmp_path, stage, world_size)

    rebuilt = optimizer_state_dict(tmp_path)

    assert rebuilt is not None
    names = [name.removeprefix("module.") for name in SHAPES]  # the Trainer's router's
    assert rebuilt["param_groups"] == [{**GROUP, "params": names}]
    state = rebuilt["state"]
    assert isinstance(state, dict)
    assert sorted(state) == sorted(names)
    for name, routed in zip(names, SHAPES, strict=True):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[name][key], values[key][routed]), (name, key)
        assert state[name]["step"] == 3
    # Each parameter's step is a tensor of its own: torch's optimizers add to it in place.
    assert len({id(state[name]["step"]) for name in names}) == len(names)
    assert checkpoint_layout(tmp_path) == (stage, world_size)


def test_consolidating_keeps_the_rebuilt_optimizer_state_and_the_runs_entries(
    tmp_path: Path,
) -> None:
    _write(tmp_path / "partitions", 2, 3)
    output = tmp_path / "whole.pt"

    consolidate(tmp_path / "partitions", output, weights_only=False)

    whole = torch.load(output, weights_only=False)
    assert whole["step"] == 7
    [optimizer] = whole["optimizer_states"]
    assert optimizer["param_groups"][0]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_an_elastic_layout_is_refused_by_name(tmp_path: Path) -> None:
    _write(tmp_path, 2, 2, elastic=True)

    with pytest.raises(CheckpointError, match="elastic layout") as raised:
        optimizer_state_dict(tmp_path)

    assert "elastic_checkpoint" in str(raised.value)  # the fix names the option


def test_optimizer_files_that_do_not_fit_the_shapes_are_refused(tmp_path: Path) -> None:
    _write(tmp_path, 3, 2)
    model_states = tmp_path / TAG / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    saved = torch.load(model_states, weights_only=False)
    saved["param_shapes"] = [OrderedDict([*SHAPES.items(), ("module.4.weight", torch.Size([64]))])]
    torch.save(saved, model_states)

    with pytest.raises(CheckpointError, match="do not fit its parameters' shapes"):
        optimizer_state_dict(tmp_path)


def test_a_checkpoint_without_an_optimizer_has_no_optimizer_state(tmp_path: Path) -> None:
    folder = tmp_path / TAG
    folder.mkdir()
    (tmp_path / "latest").write_text(TAG)
    torch.save({"module": {}, "optimizer": None}, folder / "mp_rank_00_model_states.pt")

    assert optimizer_state_dict(tmp_path) is None


def test_a_missing_model_states_file_is_named(tmp_path: Path) -> None:
    (tmp_path / TAG).mkdir()
    (tmp_path / "latest").write_text(TAG)

    with pytest.raises(CheckpointError, match="has no model-states file in 'checkpoint-1'"):
        optimizer_state_dict(tmp_path)


def _adam(parameters: dict[str, torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.Adam(list(parameters.values()), lr=0.1)


def test_a_whole_state_naming_another_parameter_is_refused_before_anything_is_set() -> None:
    parameters = {"weight": torch.nn.Parameter(torch.zeros(3))}
    optimizer = _adam(parameters)
    state = {"state": {"bias": {"exp_avg": torch.ones(3)}}, "param_groups": [{"params": ["bias"]}]}

    with pytest.raises(CheckpointError, match="'bias', which the model's parameters"):
        set_optimizer_state(
            parameters, optimizer, [], state, link=lambda: None, rank=0, world_size=1,
            source="ckpt",
        )  # fmt: skip


def test_a_moment_of_another_size_is_refused_naming_both_sizes() -> None:
    parameters = {"weight": torch.nn.Parameter(torch.zeros(3))}
    optimizer = _adam(parameters)
    state = {"state": {"weight": {"exp_avg": torch.ones(4)}}, "param_groups": [{"params": []}]}

    with pytest.raises(CheckpointError, match="'exp_avg' of 4 elements for 'weight', which has 3"):
        set_optimizer_state(
            parameters, optimizer, [], state, link=lambda: None, rank=0, world_size=1,
            source="ckpt",
        )  # fmt: skip


def test_another_number_of_parameter_groups_is_refused() -> None:
    parameters = {"weight": torch.nn.Parameter(torch.zeros(3))}
    optimizer = _adam(parameters)
    state: dict[str, object] = {"state": {}, "param_groups": [{"params": []}, {"params": []}]}

    with pytest.raises(CheckpointError, match="holds 2 optimizer parameter groups, and the"):
        set_optimizer_state(
            parameters, optimizer, [], state, link=lambda: None, rank=0, world_size=1,
            source="ckpt",
        )  # fmt: skip


def test_the_step_and_learning_rate_go_to_every_flat_tensor_and_group() -> None:
    parameters = {"weight": torch.nn.Parameter(torch.zeros(3))}
    optimizer = _adam(parameters)
    flats = [torch.zeros(2), torch.zeros(5)]  # as ZeRO's flat fp32 parts
    state = {
        "state": {"weight": {"step": torch.tensor(6.0)}},
        "param_groups": [{"lr": 0.025, "params": ["weight"]}],
    }

    set_optimizer_state(
        parameters, optimizer, flats, state, link=lambda: None, rank=0, world_size=1,
        source="ckpt",
    )  # fmt: skip

    assert [float(optimizer.state[flat]["step"]) for flat in flats] == [6.0, 6.0]
    assert optimizer.state[flats[0]]["step"] is not optimizer.state[flats[1]]["step"]
    assert optimizer.param_groups[0]["lr"] == 0.025


def test_a_stage_0_optimizer_state_is_named_by_the_names_plait_saved(tmp_path: Path) -> None:
    # Stage 0 keeps torch's own state, keyed by index, in the model-states file; the
    # optimizer's order (here not the module's) is the one plait saved beside it.
    folder = tmp_path / TAG
    folder.mkdir()
    (tmp_path / "latest").write_text(TAG)
    moments = {index: {"step": torch.tensor(2.0), "exp_avg": torch.full((2,), float(index))}
               for index in range(2)}  # fmt: skip
    torch.save(
        {
            "module": {"a.weight": torch.zeros(2), "b.weight": torch.zeros(2)},
            "optimizer": {"state": moments, "param_groups": [{**GROUP, "params": [0, 1]}]},
            PARAMETER_NAMES: ["b.weight", "a.weight"],
        },
        folder / "mp_rank_00_model_states.pt",
    )

    rebuilt = optimizer_state_dict(tmp_path)

    assert rebuilt is not None
    assert rebuilt["param_groups"] == [{**GROUP, "params": ["b.weight", "a.weight"]}]
    assert torch.equal(rebuilt["state"]["b.weight"]["exp_avg"], torch.zeros(2))
    assert torch.equal(rebuilt["state"]["a.weight"]["exp_avg"], torch.ones(2))
