"""A batch on its way to the device: what is there already is kept, the rest is moved."""

from __future__ import annotations

from collections import namedtuple

import torch

from plait.trainer.state import to_device

CPU = torch.device("cpu")
META = torch.device("meta")  # another device, on any machine

Pair = namedtuple("Pair", ["x", "label"])


def test_a_batch_on_the_device_is_returned_as_it_is() -> None:
    batch = ([torch.ones(2), (torch.tensor([1]), "label")], 3, None)
    assert to_device(batch, CPU) is batch
    assert to_device(torch.ones(1), CPU).device == CPU


def test_a_tensor_elsewhere_at_any_depth_is_moved_and_only_its_containers_are_rebuilt() -> None:
    there = torch.ones(1, device=META)
    batch: tuple[torch.Tensor, tuple[int, list[torch.Tensor]]] = (there, (7, [torch.ones(2)]))
    moved = to_device(batch, META)
    assert moved is not batch
    assert moved[1][1][0].device == META
    assert moved[0] is there
    assert batch[1][1][0].device == CPU  # the input itself is unchanged


def test_what_the_quick_look_cannot_judge_is_walked() -> None:
    # Dicts, named tuples and tensor subclasses take the full walk.
    batch = {"x": torch.ones(1), "pair": Pair(torch.ones(1), 2)}
    moved = to_device(batch, META)
    tensor = moved["x"]
    assert isinstance(tensor, torch.Tensor)
    assert tensor.device == META
    pair = moved["pair"]
    assert isinstance(pair, Pair)
    assert pair.x.device == META
    weight = torch.nn.Parameter(torch.ones(2))
    assert to_device((weight,), META)[0].device == META
    assert to_device((weight,), CPU)[0] is weight
