"""Predictions are kept complete and on the CPU, whatever tensors a step returns."""

import torch
from torch.distributed._functional_collectives import AsyncCollectiveTensor

from plait.trainer.evaluation_loop import kept


def test_a_tensor_whose_collective_may_still_run_is_waited_for_at_any_depth() -> None:
    # Tensor parallelism's outputs: pickling one (to gather predictions) reads its
    # memory directly, so a prediction kept unwaited could be read before its reduction.
    values = torch.arange(4.0)
    output = kept({"logits": [AsyncCollectiveTensor(values)], "ids": (values,)})

    assert isinstance(output, dict)
    logits = output["logits"][0]
    assert type(logits) is torch.Tensor
    assert torch.equal(logits, values)
    assert output["ids"][0] is values  # a plain tensor on the CPU is kept as it is


def test_what_is_not_a_tensor_is_kept_as_it_is() -> None:
    assert kept({"name": "x", "n": 3}) == {"name": "x", "n": 3}
