import multiprocessing
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch import nn

from plait.checkpoint_io import AsyncCheckpointIO
from plait.core import ConfigurationError, Strategy, StrategyRegistry
from plait.precision import MixedPrecision
from plait.strategies import BaseStrategy, DataParallelStrategy, DDPStrategy, SingleDeviceStrategy
from plait.strategies import Strategy as StrategyBase


def test_it_is_registered_and_meets_the_protocol() -> None:
    strategy = StrategyRegistry.get("single_device")

    assert isinstance(strategy, SingleDeviceStrategy)
    assert isinstance(strategy, Strategy)
    assert (strategy.world_size, strategy.global_rank, strategy.is_global_zero) == (1, 0, True)
    assert strategy.root_device == torch.device("cpu")


def test_plait_strategies_strategy_is_the_base_class_code_for_lightning_subclasses() -> None:
    # Lightning code reads `from ...strategies import Strategy` and subclasses it.
    assert StrategyBase is BaseStrategy
    assert issubclass(SingleDeviceStrategy, StrategyBase)

    class Mine(SingleDeviceStrategy):
        pass

    mine = Mine("cpu")
    assert isinstance(mine, StrategyBase)
    assert isinstance(mine, Strategy)  # and so meets plait.core's Protocol


def test_an_accelerator_device_without_an_index_is_the_current_one_read_when_first_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []

    def current_device() -> int:
        asked.append(1)
        return 3

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", current_device)

    strategy = SingleDeviceStrategy("cuda")
    assert asked == []  # building it does not start CUDA

    assert strategy.root_device == torch.device("cuda", 3)  # set_device and memory stats need it
    assert strategy.root_device == torch.device("cuda", 3)
    assert asked == [1]  # read once: the device does not move
    assert SingleDeviceStrategy("cuda:1").root_device == torch.device("cuda", 1)
    assert repr(strategy) == "SingleDeviceStrategy(device='cuda:3')"


def test_parts_default_by_name_and_can_be_given() -> None:
    default = SingleDeviceStrategy()
    assert type(default.accelerator).__name__ == "CPUAccelerator"
    assert type(default.precision).__name__ == "TruePrecision"
    assert type(default.checkpoint_io).__name__ == "TorchCheckpointIO"

    chosen = SingleDeviceStrategy(precision="bf16-mixed", checkpoint_io=AsyncCheckpointIO())
    assert isinstance(chosen.precision, MixedPrecision)
    assert isinstance(chosen.checkpoint_io, AsyncCheckpointIO)
    chosen.teardown()


@pytest.mark.parametrize(
    ("part", "value", "message"),
    [
        ("accelerator", object(), "is not a Accelerator"),
        ("precision", 3.5, "is not a Precision"),
        ("checkpoint_io", "pickle", "no checkpoint IO named 'pickle'"),
        ("precision", "16-mix", "did you mean '16-mixed'"),
    ],
)
def test_a_bad_part_is_refused_naming_it(part: str, value: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        SingleDeviceStrategy(**{part: value})  # type: ignore[arg-type]


def test_the_collectives_are_copies_that_keep_the_contract() -> None:
    strategy = SingleDeviceStrategy()
    ints = torch.tensor([1, 2, 4])

    mean = strategy.reduce(ints, reduce_op="mean")
    assert mean.dtype == torch.float32
    assert torch.equal(mean, ints.float())
    summed = strategy.reduce(ints, reduce_op="sum")
    assert torch.equal(summed, ints)
    assert summed is not ints
    assert strategy.reduce(3, reduce_op="mean") == 3.0
    assert isinstance(strategy.reduce(3, reduce_op="mean"), float)
    assert strategy.reduce(3, reduce_op="sum") == 3
    assert strategy.all_gather(ints).shape == (1, 3)
    assert strategy.broadcast({"a": 1}) == {"a": 1}
    assert strategy.reduce_boolean_decision(decision=True) is True
    strategy.barrier("now", timeout=timedelta(seconds=1))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda s: s.reduce("1", reduce_op="sum"),
            TypeError,
            "reduce takes a tensor or a Python number, got str",
        ),
        (lambda s: s.reduce([1], reduce_op="sum"), TypeError, "got list"),
        (
            lambda s: s.reduce(torch.ones(1), reduce_op="median"),
            ConfigurationError,
            "invalid reduce_op",
        ),
        (lambda s: s.broadcast(1, src=1), ValueError, r"src=1 is outside the ranks \[0, 1\)"),
        (lambda s: s.barrier(timeout=0), ValueError, "timeout=0 must be positive"),
        (lambda s: s.all_gather(3), TypeError, "all_gather takes a tensor, got int"),
    ],
)
def test_bad_arguments_raise_the_documented_errors(call, error, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=message):
        call(SingleDeviceStrategy())


def test_a_standalone_loop_trains_and_checkpoints(tmp_path: Path) -> None:
    torch.manual_seed(0)
    strategy = SingleDeviceStrategy()
    strategy.setup_environment()
    layer = nn.Linear(3, 1)
    model, [optimizer] = strategy.setup_module_and_optimizers(
        layer, [torch.optim.SGD(layer.parameters(), lr=0.1)]
    )
    inputs, targets = torch.randn(16, 3), torch.randn(16, 1)
    losses = []
    for _ in range(10):
        optimizer.zero_grad()
        with strategy.precision.forward_context():
            loss = nn.functional.mse_loss(model(inputs), targets)
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer)
        losses.append(loss.item())
    strategy.save_checkpoint({"model": strategy.module_state_dict(model)}, tmp_path / "last.pt")
    restored = strategy.load_checkpoint(tmp_path / "last.pt")
    strategy.teardown()

    assert losses[-1] < losses[0]
    assert torch.equal(restored["model"]["weight"], model.state_dict()["weight"])


def test_optimizers_of_another_model_are_refused() -> None:
    strategy = SingleDeviceStrategy()
    other = nn.Linear(2, 2)

    with pytest.raises(
        ConfigurationError, match="optimizer 0 holds parameters that are not the module's"
    ):
        strategy.setup_module_and_optimizers(
            nn.Linear(2, 2), [torch.optim.SGD(other.parameters(), lr=0.1)]
        )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"process_group_backend": "glooo"}, "did you mean 'gloo'"),
        ({"timeout": 30}, "timeout=30 must be a positive timedelta"),
        ({"start_timeout": timedelta(0)}, "must be a positive timedelta"),
        ({"ddp_comm_wrapper": lambda hook: hook}, "apply to a ddp_comm_hook, and none was given"),
        ({"ddp_comm_hook": "fp16"}, "is not callable"),
        ({"cluster_environment": 5}, "is not a ClusterEnvironment"),
        ({"model_averaging_period": 0}, "must be an int of at least 1"),
        ({"model_averaging_period": 4}, "ddp_comm_state is NoneType, not a PostLocalSGDState"),
    ],
)
def test_bad_ddp_settings_are_refused_before_anything_starts(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        DDPStrategy(accelerator="cpu", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "message", "fix"),
    [
        # Where Lightning refuses, plait does too, by name, before anything starts.
        (
            lambda: DDPStrategy(parallel_devices=[torch.device("mps")]),
            "DDPStrategy on MPS: torch.distributed has no backend",
            "strategy='single_device'",
        ),
        (
            lambda: StrategyRegistry.get("deepspeed", parallel_devices=[torch.device("mps")]),
            "DeepSpeedStrategy on MPS",
            "strategy='single_device'",
        ),
        (
            lambda: DDPStrategy(accelerator="cpu", parallel_devices=[torch.device("cuda", 0)]),
            "parallel_devices are cuda devices, and the accelerator 'cpu' runs on cpu",
            "give cpu devices",
        ),
        pytest.param(
            lambda: DDPStrategy(accelerator="cuda"),
            "no cuda device is visible to torch",
            "accelerator='cpu'",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here"),
        ),
        (
            lambda: StrategyRegistry.get("model_parallel", precision="16-mixed"),
            r"ModelParallelStrategy with MixedPrecision\('16-mixed'",
            "precision='bf16-mixed'",
        ),
    ],
)
def test_what_lightning_refuses_is_refused_with_the_fix(
    make: Callable[[], object], message: str, fix: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        make()
    assert caught.value.fix is not None
    assert fix in caught.value.fix


def test_fork_where_the_platform_cannot_fork_is_refused_even_for_one_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])

    for name in ("ddp_fork", "ddp_notebook"):
        with pytest.raises(
            ConfigurationError, match="start_method='fork' is not available"
        ) as caught:
            StrategyRegistry.get(name, accelerator="cpu")
        assert caught.value.fix is not None
        assert "ddp_spawn" in caught.value.fix
    assert StrategyRegistry.get("ddp_spawn", accelerator="cpu").world_size == 1


def test_collectives_before_setup_say_what_to_do() -> None:
    with pytest.raises(ConfigurationError, match=r"call strategy.setup_environment\(\) first"):
        DDPStrategy(accelerator="cpu").reduce(1, reduce_op="sum")


def test_steps_run_the_module_in_the_precision_context() -> None:
    strategy = SingleDeviceStrategy(precision="bf16-mixed")
    model = strategy.setup_module(nn.Linear(3, 2))
    inputs = torch.randn(4, 3, dtype=torch.float64)

    trained = strategy.training_step(model, inputs)
    validated = strategy.validation_step(model, inputs)
    predicted = strategy.predict_step(model, input=inputs)

    assert isinstance(trained, torch.Tensor)
    assert trained.dtype == torch.bfloat16  # autocast ran
    assert trained.requires_grad
    assert isinstance(validated, torch.Tensor)
    assert not validated.requires_grad
    assert isinstance(predicted, torch.Tensor)
    assert predicted.dtype == torch.float32  # converted back for the caller
    assert torch.equal(strategy.test_step(model, inputs), validated)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="this machine has a CUDA device")
def test_dp_without_cuda_points_to_ddp() -> None:
    with pytest.raises(ConfigurationError, match="splits batches across CUDA GPUs") as caught:
        StrategyRegistry.get("dp")

    assert caught.value.fix is not None
    assert "strategy='ddp'" in caught.value.fix


def test_dp_refuses_devices_that_are_not_cuda() -> None:
    with pytest.raises(ConfigurationError, match="the devices are: cpu, cpu"):
        DataParallelStrategy([torch.device("cpu")] * 2)


@pytest.mark.cuda
def test_dp_splits_a_batch_across_the_gpus() -> None:
    strategy = DataParallelStrategy()
    model = strategy.setup_module(nn.Linear(3, 2))
    output = strategy.training_step(model, torch.randn(8, 3, device=strategy.root_device))

    assert isinstance(output, torch.Tensor)
    assert output.shape == (8, 2)
    assert output.device == strategy.root_device
    assert set(strategy.module_state_dict(model)) == {"weight", "bias"}


def test_setup_does_everything_in_one_call() -> None:
    strategy = SingleDeviceStrategy(precision="64-true")
    layer = nn.Linear(2, 2)

    model, [optimizer] = strategy.setup(layer, [torch.optim.SGD(layer.parameters(), lr=0.1)])

    assert next(model.parameters()).dtype == torch.float64
    assert optimizer.param_groups[0]["params"][0] is next(model.parameters())
    strategy.teardown()


def test_the_one_group_of_one_process_is_accepted_and_a_reduction_name_is_not_a_group() -> None:
    strategy = SingleDeviceStrategy("cpu")
    assert strategy.reduce(3, group="data_parallel", reduce_op="sum") == 3
    assert strategy.all_gather(torch.ones(2), group="data_parallel").shape == (1, 2)
    with pytest.raises(ConfigurationError, match="pass reduce_op='sum'"):
        strategy.reduce(3, "sum")
    with pytest.raises(ConfigurationError, match="'data_parallel'") as raised:
        strategy.barrier(group="tensor")
    assert raised.value.value == "tensor"


@pytest.fixture
def new_parameters_on_conversion() -> object:
    # How moving to an XLA device behaves: the moved module holds new Parameter
    # objects, not the ones the optimizer was made over.
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    yield
    torch.__future__.set_overwrite_module_params_on_conversion(before)


@pytest.mark.usefixtures("new_parameters_on_conversion")
def test_optimizers_made_before_set_up_step_the_parameters_a_conversion_replaced() -> None:
    module = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    module(torch.ones(2, 3)).sum().backward()
    optimizer.step()  # a momentum buffer, keyed by the old parameter
    optimizer.zero_grad()
    strategy = SingleDeviceStrategy(precision="64-true")

    wrapped, (prepared,) = strategy.setup_module_and_optimizers(module, [optimizer])

    parameters = list(wrapped.parameters())
    assert parameters[0].dtype == torch.float64
    held = prepared.param_groups[0]["params"]
    assert [id(p) for p in held] == [id(p) for p in parameters]
    assert set(map(id, prepared.state)) == set(map(id, parameters))
    before = parameters[0].detach().clone()
    wrapped(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
    prepared.step()
    assert not torch.equal(parameters[0], before)
