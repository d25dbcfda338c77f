from collections import namedtuple
from collections.abc import Callable

import pytest
import torch
from torch import nn
from typing_extensions import override

from plait.core import ConfigurationError, Precision
from plait.precision import MixedPrecision, TruePrecision


def model_and_optimizer(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train(precision: Precision, steps: int = 20) -> tuple[nn.Module, list[float]]:
    model, optimizer = model_and_optimizer()
    model = precision.convert_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(1)
    inputs, targets = torch.randn(64, 8), torch.randn(64, 1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        with precision.forward_context():
            output = model(precision.convert_input(inputs))
            loss = nn.functional.mse_loss(output.float(), targets)
        precision.backward(loss, model)
        precision.clip_gradients(model, optimizer, 1.0)
        precision.optimizer_step(optimizer)
        losses.append(precision.convert_output(loss).item())
    return model, losses


@pytest.mark.parametrize(
    ("precision", "parameter_dtype"),
    [
        (TruePrecision(torch.float32), torch.float32),
        (TruePrecision(torch.float64), torch.float64),
        (TruePrecision(torch.bfloat16), torch.bfloat16),
        (TruePrecision(torch.float16), torch.float16),
        (MixedPrecision(torch.bfloat16), torch.float32),
        (MixedPrecision(torch.float16), torch.float32),
    ],
    ids=repr,
)
def test_each_format_trains_on_the_cpu(precision: Precision, parameter_dtype: torch.dtype) -> None:
    model, losses = train(precision)

    assert {p.dtype for p in model.parameters()} == {parameter_dtype}
    assert losses[-1] < losses[0]


def test_mixed_precision_computes_in_the_low_dtype_and_keeps_float32_weights() -> None:
    precision = MixedPrecision(torch.bfloat16)
    layer = precision.convert_module(nn.Linear(4, 4))

    with precision.forward_context():
        output = layer(precision.convert_input(torch.randn(2, 4, dtype=torch.float64)))

    assert output.dtype == torch.bfloat16
    assert layer.weight.dtype == torch.float32
    assert precision.convert_output(output).dtype == torch.float32
    # Lightning's name of the same context.
    with precision.autocast_context_manager():
        assert layer(torch.randn(2, 4)).dtype == torch.bfloat16


def test_true_precision_makes_new_tensors_in_its_dtype_during_forward() -> None:
    precision = TruePrecision(torch.float64)

    with precision.forward_context():
        inside = torch.ones(1)
    outside = torch.ones(1)

    assert (inside.dtype, outside.dtype) == (torch.float64, torch.float32)


Pair = namedtuple("Pair", ["x", "label"])


def test_inputs_are_converted_through_nested_structures() -> None:
    precision = TruePrecision(torch.bfloat16)
    data = {
        "a": [torch.ones(2), (torch.ones(1, dtype=torch.float64), 3)],
        "b": Pair(torch.ones(1), torch.tensor([1])),
    }

    converted = precision.convert_input(data)

    assert converted["a"][0].dtype == torch.bfloat16
    assert converted["a"][1][0].dtype == torch.bfloat16
    assert converted["a"][1][1] == 3
    assert isinstance(converted["b"], Pair)
    assert converted["b"].x.dtype == torch.bfloat16
    assert converted["b"].label.dtype == torch.int64  # integers are left alone


def test_a_batch_that_needs_no_cast_is_returned_as_it_is_and_one_that_does_is_rebuilt() -> None:
    first = torch.ones(2)
    untouched = [first, {"n": (torch.tensor([1]), "label")}, Pair(torch.ones(1), 2)]
    assert TruePrecision(torch.float32).convert_input(untouched) is untouched

    converted = TruePrecision(torch.float64).convert_input(untouched)

    assert converted is not untouched
    assert converted[1] is untouched[1]  # nothing floating in it: the same dict
    assert isinstance(converted[2], Pair)
    assert converted[2].x.dtype == torch.float64
    assert first.dtype == torch.float32  # the input itself is unchanged


def inf_gradient_step(precision: MixedPrecision) -> tuple[torch.Tensor, torch.Tensor]:
    model, optimizer = model_and_optimizer()
    before = [p.detach().clone() for p in model.parameters()]
    with precision.forward_context():
        loss = model(torch.randn(4, 8)).float().sum()
    precision.backward(loss, model)
    first = next(model.parameters())
    assert first.grad is not None
    first.grad[0, 0] = float("inf")
    result = precision.optimizer_step(optimizer)
    after = [p.detach().clone() for p in model.parameters()]
    assert result is None
    return torch.cat([b.flatten() for b in before]), torch.cat([a.flatten() for a in after])


def test_fp16_mixed_skips_a_step_with_inf_gradients_and_shrinks_the_scale() -> None:
    precision = MixedPrecision(torch.float16)
    assert precision.scaler is not None
    scale = precision.scaler.get_scale()

    before, after = inf_gradient_step(precision)

    assert torch.equal(before, after)
    assert precision.scaler.get_scale() == scale * 0.5


def test_fp16_mixed_clips_the_unscaled_gradients() -> None:
    # A small scale: at the default 2**16, this first backward overflows float16.
    precision = MixedPrecision(torch.float16, scaler=torch.amp.GradScaler("cpu", init_scale=16.0))
    model, optimizer = model_and_optimizer()
    with precision.forward_context():
        loss = model(torch.randn(16, 8)).float().sum()
    precision.backward(loss, model)  # the gradients are scaled by 16 here

    precision.clip_gradients(model, optimizer, 0.01, "norm")

    norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
    )
    assert norm.item() == pytest.approx(0.01, rel=1e-3)


def test_clipping_by_value_bounds_every_gradient() -> None:
    precision = TruePrecision()
    model, optimizer = model_and_optimizer()
    model(torch.randn(16, 8)).pow(2).sum().mul(100).backward()

    precision.clip_gradients(model, optimizer, 0.01, "value")

    assert all(p.grad.abs().max() <= 0.01 for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize(
    ("clip_val", "algorithm", "message"),
    [
        (-1, "norm", "must be a number of at least 0"),
        ("1.0", "value", "must be a number of at least 0"),
        (1.0, "l2", "invalid gradient_clip_algorithm"),
    ],
)
def test_bad_clipping_settings_are_refused(clip_val: float, algorithm: str, message: str) -> None:
    model, optimizer = model_and_optimizer()
    with pytest.raises(ConfigurationError, match=message):
        TruePrecision().clip_gradients(model, optimizer, clip_val, algorithm)  # type: ignore[arg-type]


@pytest.mark.parametrize("precision", [TruePrecision(), MixedPrecision(torch.float16)])
def test_clip_val_zero_clips_nothing(precision: TruePrecision | MixedPrecision) -> None:
    model, optimizer = model_and_optimizer()
    precision.backward(model(torch.randn(16, 8)).pow(2).sum().mul(100), model)
    before = [p.grad.clone() for p in model.parameters() if p.grad is not None]

    precision.clip_gradients(model, optimizer, 0.0, "norm")
    precision.clip_gradients(model, optimizer, 0, "value")

    after = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_each_clipping_algorithm_goes_through_its_own_hook() -> None:
    # As Lightning's precision plugins: a plugin of yours overrides clip_grad_by_norm
    # or clip_grad_by_value, and clip_gradients calls the one asked for.
    calls: list[tuple[str, float]] = []

    class Counting(TruePrecision):
        @override
        def clip_grad_by_norm(self, optimizer: torch.optim.Optimizer, clip_val: float) -> None:
            calls.append(("norm", clip_val))

        @override
        def clip_grad_by_value(self, optimizer: torch.optim.Optimizer, clip_val: float) -> None:
            calls.append(("value", clip_val))

    counting = Counting()
    model, optimizer = model_and_optimizer()
    model(torch.randn(16, 8)).pow(2).sum().backward()

    counting.clip_gradients(model, optimizer, 0.0, "norm")
    counting.clip_gradients(model, optimizer, 0.5, "norm")
    counting.clip_gradients(model, optimizer, 0.25, "value")

    assert calls == [("norm", 0.5), ("value", 0.25)]


def test_the_scaler_state_round_trips_through_a_checkpoint() -> None:
    trained = MixedPrecision(torch.float16)
    inf_gradient_step(trained)
    state = trained.state_dict()

    fresh = MixedPrecision(torch.float16)
    fresh.load_state_dict(state)

    assert fresh.scaler is not None
    assert trained.scaler is not None
    assert fresh.scaler.get_scale() == trained.scaler.get_scale() == 2.0**15
    assert TruePrecision().state_dict() == {}
    assert MixedPrecision(torch.bfloat16).state_dict() == {}


def test_loading_scaler_state_into_bf16_warns_that_it_is_ignored() -> None:
    state = MixedPrecision(torch.float16).state_dict()

    with pytest.warns(UserWarning, match="gradient scaler's state, which bf16-mixed does not use"):
        MixedPrecision(torch.bfloat16).load_state_dict(state)


def test_a_closure_runs_before_the_scaled_step() -> None:
    precision = MixedPrecision(torch.float16)
    model, optimizer = model_and_optimizer()
    calls = []

    def closure() -> None:
        calls.append(1)
        optimizer.zero_grad()
        with precision.forward_context():
            loss = model(torch.randn(4, 8)).float().sum()
        precision.backward(loss, model)

    precision.optimizer_step(optimizer, closure)

    assert calls == [1]


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["16-mixed", "bf16-mixed"])
def test_mixed_precision_on_cuda(name: str) -> None:
    dtype = torch.float16 if name == "16-mixed" else torch.bfloat16
    precision = MixedPrecision(dtype, device_type="cuda")
    layer = nn.Linear(8, 8).cuda()

    with precision.forward_context():
        output = layer(torch.randn(4, 8, device="cuda"))

    assert output.dtype == dtype
    assert (precision.scaler is not None) == (dtype == torch.float16)


@pytest.mark.parametrize(
    ("name", "param", "compute", "reduce", "scaler"),
    [
        ("32-true", torch.float32, torch.float32, torch.float32, False),
        ("64-true", torch.float64, torch.float64, torch.float64, False),
        ("bf16-true", torch.bfloat16, torch.bfloat16, torch.bfloat16, False),
        ("bf16-mixed", torch.float32, torch.bfloat16, torch.float32, False),
        ("16-mixed", torch.float32, torch.float16, torch.float32, True),
    ],
)
def test_each_format_states_its_dtypes(
    name: str, param: torch.dtype, compute: torch.dtype, reduce: torch.dtype, scaler: bool
) -> None:
    plugin: Precision = (MixedPrecision if "mixed" in name else TruePrecision)(name)
    assert plugin.param_dtype == param
    assert plugin.compute_dtype == compute
    assert plugin.reduce_dtype == reduce
    assert plugin.needs_scaler is scaler
    model = plugin.convert_module(nn.Linear(2, 2))
    assert model.weight.dtype == plugin.param_dtype


def test_plugins_are_made_from_the_names_users_know() -> None:
    assert MixedPrecision("bf16-mixed").dtype == torch.bfloat16
    assert TruePrecision("64-true").dtype == torch.float64


@pytest.mark.parametrize(
    ("make", "name", "listed"),
    [(MixedPrecision, "bf16-true", "'bf16-mixed'"), (TruePrecision, "16-mixed", "'32-true'")],
)
def test_a_name_of_another_kind_of_format_is_refused_with_the_valid_ones(
    make: Callable[[str], Precision], name: str, listed: str
) -> None:
    with pytest.raises(ConfigurationError, match=name) as raised:
        make(name)
    assert listed in str(raised.value)


def test_the_quick_look_at_a_batch_still_finds_a_tensor_to_cast_at_any_depth() -> None:
    # The usual batch (tuples and lists of tensors) is looked at without a walk's
    # calls; a tensor to cast anywhere in it, or what the look cannot judge (a tensor
    # subclass, a dict), still gets the full walk.
    deep = torch.ones(2, dtype=torch.float64)
    batch: tuple[tuple[torch.Tensor, tuple[int, list[torch.Tensor]]], int] = (
        (torch.ones(1), (7, [deep])),
        3,
    )
    converted = TruePrecision(torch.float32).convert_input(batch)
    assert converted is not batch
    assert converted[0][1][1][0].dtype == torch.float32
    assert converted[0][0] is batch[0][0]

    weight = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    assert TruePrecision(torch.float32).convert_input((weight,))[0].dtype == torch.float32
    mixed = (torch.ones(1), {"x": torch.ones(1, dtype=torch.float64)})
    assert TruePrecision(torch.float32).convert_input(mixed)[1]["x"].dtype == torch.float32

    ints = (torch.tensor([1]), [torch.tensor([2], dtype=torch.int32)], None, "label")
    assert TruePrecision(torch.float32).convert_input(ints) is ints
