"""DDPStrategy in this process: start-up, overriding, registration, and its launcher."""

import socket
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from plait.accelerators import CPUAccelerator
from plait.checkpoint_io import TorchCheckpointIO
from plait.core import (
    Collectives,
    CollectiveTimeoutError,
    ConfigurationError,
    MissingDependencyError,
    StrategyRegistry,
    SupportsLauncher,
    SupportsNoSync,
    free_port,
)
from plait.core.typing import PathLike
from plait.precision import TruePrecision
from plait.strategies import DDPStrategy, DistributedCollectives, FSDPStrategy, parts
from plait.strategies.launchers import (
    ExternalLauncher,
    MultiprocessingLauncher,
    SubprocessScriptLauncher,
)


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world_size: int, port: int) -> None:
    for variable, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world_size),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
    }.items():
        monkeypatch.setenv(variable, value)


def test_start_up_names_the_ranks_that_never_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch, 0, 3, free_port())
    strategy = DDPStrategy(accelerator="cpu", start_timeout=timedelta(seconds=1))

    with pytest.raises(CollectiveTimeoutError) as caught:
        strategy.setup_environment()

    assert caught.value.missing_ranks == (1, 2)
    assert str(caught.value) == (
        "start-up timed out after 1 s: ranks 1, 2 did not arrive (arrived: 0)"
    )


def test_start_up_without_a_reachable_rank_zero_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()  # nobody listens there
    as_rank(monkeypatch, 1, 2, port)
    strategy = DDPStrategy(accelerator="cpu", start_timeout=timedelta(seconds=1))

    with pytest.raises(CollectiveTimeoutError, match=f"start-up '127.0.0.1:{port}'") as caught:
        strategy.setup_environment()

    assert caught.value.missing_ranks == (0,)


def test_rank_zero_on_a_port_another_program_holds_names_the_port_and_master_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as holder:  # another job's server, on the port this job derived
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        as_rank(monkeypatch, 0, 2, port)
        strategy = DDPStrategy(accelerator="cpu", start_timeout=timedelta(seconds=1))

        with pytest.raises(ConfigurationError) as caught:
            strategy.setup_environment()

    assert f"could not serve the job's store at 127.0.0.1:{port}" in str(caught.value)
    assert caught.value.value == port
    assert caught.value.fix is not None
    assert "MASTER_PORT" in caught.value.fix


class RecordingCheckpointIO(TorchCheckpointIO):
    def __init__(self) -> None:
        super().__init__()
        self.saved: list[str] = []

    @override
    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        self.saved.append(str(path))
        super().save_checkpoint(checkpoint, path)


class WrapTwiceDDP(DDPStrategy):
    """Overrides configure_ddp, as users do to wrap the module their own way."""

    @override
    def configure_ddp(self, module: nn.Module) -> nn.Module:
        return DistributedDataParallel(
            nn.Sequential(module), process_group=self.process_group, gradient_as_bucket_view=True
        )


def test_a_registered_variant_with_its_own_checkpoint_io_saves_through_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    io = RecordingCheckpointIO()
    StrategyRegistry.register(
        "ddp_custom_checkpoint_io",
        DDPStrategy,
        description="DDP that records its saves",
        checkpoint_io=io,
        accelerator="cpu",
    )
    try:
        as_rank(monkeypatch, 0, 1, free_port())
        strategy = StrategyRegistry.get("ddp_custom_checkpoint_io")
        assert isinstance(strategy, DDPStrategy)
        strategy.setup_environment()
        model = strategy.setup_module(nn.Linear(2, 2))
        strategy.save_checkpoint({"model": strategy.module_state_dict(model)}, tmp_path / "a.pt")
        strategy.teardown()
    finally:
        StrategyRegistry.remove("ddp_custom_checkpoint_io")

    assert strategy.checkpoint_io is io
    assert io.saved == [str(tmp_path / "a.pt")]


def test_configure_ddp_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch, 0, 1, free_port())
    strategy = WrapTwiceDDP(accelerator="cpu")
    strategy.setup_environment()
    try:
        wrapped = strategy.setup_module(nn.Linear(2, 2))
        assert isinstance(wrapped, DistributedDataParallel)
        assert isinstance(wrapped.module, nn.Sequential)
        assert wrapped.gradient_as_bucket_view
        assert set(strategy.module_state_dict(wrapped)) == {"0.weight", "0.bias"}
        assert isinstance(strategy, SupportsNoSync)
        with strategy.no_sync(wrapped):
            wrapped(torch.ones(1, 2)).sum().backward()
    finally:
        strategy.teardown()


def test_backends_torch_knows_are_accepted_and_one_it_does_not_is_named() -> None:
    # Lightning passes any name on to torch: so does plait, for every name torch
    # knows, a package's registered backend included (hccl from torch_npu).
    def never_made(*arguments: object) -> None:
        raise AssertionError("no group is made in this test")

    if "plaittestbackend" not in torch.distributed.Backend.backend_list:
        torch.distributed.Backend.register_backend("plaittestbackend", never_made, devices=["cpu"])
    for backend in ("xccl", "plaittestbackend", "cpu:gloo,cuda:nccl"):
        strategy = DDPStrategy(accelerator="cpu", process_group_backend=backend)
        assert strategy.process_group_backend == backend

    with pytest.raises(ConfigurationError, match="invalid process_group_backend: 'hccl'") as caught:
        DDPStrategy(accelerator="cpu", process_group_backend="hccl")
    assert caught.value.fix is not None
    assert "torch_npu" in caught.value.fix
    assert "plaittestbackend" in str(caught.value)


def test_no_sync_on_a_module_never_set_up_is_refused_not_a_block_that_does_nothing() -> None:
    strategy = DDPStrategy(accelerator="cpu")
    plain = nn.Linear(2, 2)

    refused = pytest.raises(ConfigurationError, match="Linear this strategy never set up")
    with refused as caught, strategy.no_sync(plain):
        pass  # pragma: no cover - the block is refused before it starts

    assert "pass the module setup_module" in str(caught.value)
    with strategy.no_sync(plain, enabled=False):  # no block at all: nothing to refuse
        pass


def test_a_second_setup_environment_is_harmless(monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch, 0, 1, free_port())
    strategy = DDPStrategy(accelerator="cpu")
    strategy.setup_environment()
    try:
        strategy.setup_environment()
        assert strategy.reduce(2, reduce_op="sum") == 2
    finally:
        strategy.teardown()
        strategy.teardown()  # safe to call more than once


def test_an_existing_process_group_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    as_rank(monkeypatch, 0, 1, free_port())
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        with pytest.raises(ConfigurationError, match="already initialised"):
            DDPStrategy(accelerator="cpu").setup_environment()
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize(
    ("start_method", "launcher"),
    [
        ("popen", SubprocessScriptLauncher),
        ("spawn", MultiprocessingLauncher),
        ("fork", MultiprocessingLauncher),
    ],
)
def test_the_launcher_follows_the_start_method(start_method: str, launcher: type) -> None:
    strategy = DDPStrategy(
        accelerator="cpu", start_method=start_method, parallel_devices=[torch.device("cpu")] * 3
    )

    assert isinstance(strategy, SupportsLauncher)
    assert type(strategy.launcher) is launcher
    assert strategy.num_processes == 3


def test_processes_started_by_a_scheduler_need_no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch, 1, 2, free_port())  # LOCAL_RANK set: started by someone else

    assert type(DDPStrategy(accelerator="cpu").launcher) is ExternalLauncher


def test_an_unknown_start_method_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'spawn'"):
        DDPStrategy(accelerator="cpu", start_method="spwan")


def test_every_ddp_name_is_registered() -> None:
    names = set(StrategyRegistry.available_strategies())

    assert {
        "ddp",
        "ddp_spawn",
        "ddp_fork",
        "ddp_notebook",
        "ddp_find_unused_parameters_true",
        "ddp_sharded",
        "dp",
        "single_device",
    } <= names
    unused = StrategyRegistry.get("ddp_find_unused_parameters_true", accelerator="cpu")
    assert isinstance(unused, DDPStrategy)
    assert unused.ddp_kwargs == {"find_unused_parameters": True}
    # Lightning's names for DDP's default, each launcher's.
    for name, start_method in (
        ("ddp_find_unused_parameters_false", "popen"),
        ("ddp_spawn_find_unused_parameters_false", "spawn"),
        ("ddp_fork_find_unused_parameters_false", "fork"),
        ("ddp_notebook_find_unused_parameters_false", "fork"),
    ):
        default = StrategyRegistry.get(name, accelerator="cpu")
        assert isinstance(default, DDPStrategy)
        assert (default.start_method, default.ddp_kwargs) == (start_method, {})
        # and for unused parameters tolerated, under that launcher
        tolerant = StrategyRegistry.get(name.replace("_false", "_true"), accelerator="cpu")
        assert isinstance(tolerant, DDPStrategy)
        assert (tolerant.start_method, tolerant.ddp_kwargs) == (
            start_method,
            {"find_unused_parameters": True},
        )


def test_a_strategy_registers_with_a_decorator_as_in_lightning() -> None:
    @StrategyRegistry.register("ddp_decorated", description="DDP, registered by decorator")
    class Decorated(DDPStrategy):
        pass

    try:
        assert isinstance(Decorated, type)  # the decorator gives the class back
        assert isinstance(StrategyRegistry.get("ddp_decorated", accelerator="cpu"), Decorated)
        assert StrategyRegistry.register("ddp_returned", Decorated) is Decorated
    finally:
        StrategyRegistry.remove("ddp_decorated")
        StrategyRegistry.remove("ddp_returned")


class WithSpare(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(2, 1)
        self.spare = nn.Linear(2, 1)

    @override
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        output: torch.Tensor = self.used(inputs)
        return output


def test_parameters_no_loss_used_are_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch, 0, 1, free_port())
    strategy = DDPStrategy(accelerator="cpu")
    strategy.setup_environment()
    try:
        model = strategy.setup_module(WithSpare())
        strategy.backward(model(torch.ones(1, 2)).sum(), model)
        with pytest.raises(ConfigurationError) as caught:
            model(torch.ones(1, 2))  # DDP notices on the next step
    finally:
        strategy.teardown()

    assert caught.value.value == ["spare.weight", "spare.bias"]
    assert "the parameters spare.weight, spare.bias took no part" in str(caught.value)
    assert caught.value.fix is not None
    assert "ddp_find_unused_parameters_true" in caught.value.fix


def test_with_find_unused_parameters_the_same_model_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch, 0, 1, free_port())
    strategy = StrategyRegistry.get("ddp_find_unused_parameters_true", accelerator="cpu")
    assert isinstance(strategy, DDPStrategy)
    strategy.setup_environment()
    try:
        model = strategy.setup_module(WithSpare())
        for _ in range(2):
            strategy.backward(model(torch.ones(1, 2)).sum(), model)
    finally:
        strategy.teardown()


def test_parts_given_as_objects_are_the_ones_used() -> None:
    accelerator = CPUAccelerator()
    precision = TruePrecision(torch.float64)
    io = TorchCheckpointIO(weights_only=False)

    strategy = DDPStrategy(accelerator=accelerator, precision=precision, checkpoint_io=io)

    assert strategy.accelerator is accelerator
    assert strategy.precision is precision
    assert strategy.checkpoint_io is io


@pytest.mark.parametrize(
    ("option", "suggested"),
    [("statc_graph", "static_graph"), ("find_unused_parameter", "find_unused_parameters")],
)
def test_a_misspelt_option_is_refused_when_the_strategy_is_made(
    option: str, suggested: str
) -> None:
    options: dict[str, object] = {option: True}
    with pytest.raises(ConfigurationError, match=f"option {option}=") as raised:
        DDPStrategy(**options)  # type: ignore[arg-type]
    assert raised.value.suggestion == suggested
    assert "DistributedDataParallel" in str(raised.value)


def test_an_option_the_strategy_sets_itself_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="sets DistributedDataParallel's device_ids"):
        DDPStrategy(device_ids=[0])


def test_the_options_of_distributed_data_parallel_are_taken() -> None:
    strategy = DDPStrategy(static_graph=True, bucket_cap_mb=10)
    assert strategy.ddp_kwargs == {"static_graph": True, "bucket_cap_mb": 10}


class OwnWrapperDDP(DDPStrategy):
    @override
    def configure_ddp(self, module: nn.Module) -> nn.Module:
        return module


def test_a_subclass_that_wraps_its_own_way_takes_its_own_options() -> None:
    assert OwnWrapperDDP(my_option=1).ddp_kwargs == {"my_option": 1}


def test_a_precision_given_as_precision_plugin_is_used_and_kept_by_replace() -> None:
    strategy = DDPStrategy(precision_plugin="bf16-mixed")
    assert strategy.precision.compute_dtype == torch.bfloat16
    assert strategy.precision_plugin is strategy.precision
    assert strategy.arguments["precision"] == "bf16-mixed"
    assert strategy.replace(start_method="spawn").precision.compute_dtype == torch.bfloat16


def test_two_precisions_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="two precisions were given"):
        DDPStrategy(precision="32-true", precision_plugin="bf16-mixed")


class SeedStyleDDP(DDPStrategy):
    @override
    def configure_ddp(self) -> None:  # type: ignore[override]
        assert self.model is not None
        self.model = DistributedDataParallel(self.model, process_group=self.process_group)


def test_configure_ddp_may_replace_self_model_as_in_lightning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    as_rank(monkeypatch, 0, 1, free_port())
    strategy = SeedStyleDDP(accelerator="cpu")
    strategy.setup_environment()
    try:
        wrapped = strategy.setup_module(nn.Linear(2, 2))
        assert isinstance(wrapped, DistributedDataParallel)
        assert strategy.model is wrapped
    finally:
        strategy.teardown()
    assert strategy.model is None


class CountingCollectives:
    """Collectives of a strategy's own: plait's, each call counted."""

    def __init__(self, distributed: DistributedCollectives) -> None:
        self.distributed = distributed
        self.calls: list[str] = []

    def reduce(self, value: object, group: object = None, reduce_op: object = "mean") -> object:
        self.calls.append("reduce")
        return self.distributed.reduce(value, group, reduce_op)  # type: ignore[call-overload]

    def broadcast(self, obj: object, src: int = 0, group: object = None) -> object:
        self.calls.append("broadcast")
        return self.distributed.broadcast(obj, src, group)  # type: ignore[arg-type]

    def barrier(self, name: object = None, timeout: object = None, group: object = None) -> None:
        self.calls.append("barrier")
        self.distributed.barrier(name, timeout, group)  # type: ignore[arg-type]

    def all_gather(self, tensor: torch.Tensor, group: object = None) -> torch.Tensor:
        self.calls.append("all_gather")
        return self.distributed.all_gather(tensor, group)  # type: ignore[arg-type]

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002
        self.calls.append("reduce_boolean_decision")
        return self.distributed.reduce_boolean_decision(decision, all)


class OwnCollectivesDDP(DDPStrategy):
    @override
    def make_collectives(self, distributed: DistributedCollectives) -> Collectives:
        return CountingCollectives(distributed)  # type: ignore[return-value]


class NotCollectivesDDP(DDPStrategy):
    @override
    def make_collectives(self, distributed: DistributedCollectives) -> Collectives:
        return object()  # type: ignore[return-value]


def test_a_strategy_brings_its_own_collectives_built_on_plaits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    as_rank(monkeypatch, 0, 1, free_port())
    strategy = OwnCollectivesDDP(accelerator="cpu")
    with pytest.raises(ConfigurationError, match="has not joined its process group"):
        _ = strategy.collectives
    strategy.setup_environment()
    try:
        own: object = strategy.collectives
        assert isinstance(own, CountingCollectives)
        # The group and plait's collectives stay reachable: no recursion through them.
        assert strategy.process_group is strategy.distributed_collectives.group
        assert own.distributed is strategy.distributed_collectives
        assert strategy.reduce(torch.tensor([1.0, 3.0]), reduce_op="sum").tolist() == [1.0, 3.0]
        strategy.barrier("together")
        strategy.distributed_collectives.check("my_collective", shape=(2,), dtype="float32")
        assert own.calls == ["reduce", "barrier"]
    finally:
        strategy.teardown()


def test_collectives_that_break_the_protocol_are_refused_at_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    as_rank(monkeypatch, 0, 1, free_port())
    strategy = NotCollectivesDDP(accelerator="cpu")
    try:
        with pytest.raises(ConfigurationError, match=r"NotCollectivesDDP.make_collectives return"):
            strategy.setup_environment()
    finally:
        strategy.teardown()


def test_parts_from_missing_distributions_are_named_at_once_with_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    absent = {"plait-accelerators", "plait-checkpoint-io"}
    monkeypatch.setattr(parts, "_installed", lambda distribution: distribution not in absent)

    with pytest.raises(MissingDependencyError) as missing:
        DDPStrategy()

    assert missing.value.install == "plait-strategies[parts]"
    assert "plait-accelerators, plait-checkpoint-io" in str(missing.value)
    # Parts given as objects need no distribution of their own.
    given = DDPStrategy(
        accelerator=CPUAccelerator(), precision="32-true", checkpoint_io=TorchCheckpointIO()
    )
    assert isinstance(given.checkpoint_io, TorchCheckpointIO)


def test_a_subclass_prints_as_itself() -> None:
    # A third party's strategy (or a conformance report about it) shows its own name.
    class TunedDDP(DDPStrategy):
        pass

    class TunedFSDP(FSDPStrategy):
        pass

    assert repr(TunedDDP()) == "TunedDDP(backend='gloo', world_size=1, device='cpu')"
    assert repr(TunedFSDP()).startswith("TunedFSDP(sharding_strategy='FULL_SHARD', ")
    assert repr(DDPStrategy()).startswith("DDPStrategy(")


def test_the_process_that_launches_the_ranks_does_not_describe_its_own_world_as_the_jobs() -> None:
    # Under a spawning launcher the caller is no rank: its world is of one.
    spawning = DDPStrategy(accelerator="cpu", parallel_devices=[torch.device("cpu")] * 2)
    assert repr(spawning) == (
        "DDPStrategy(backend='gloo', world_size=1 here, 2 processes per node when "
        "launched, device='cpu')"
    )


def test_ddp_declares_the_buffers_it_broadcasts_or_leaves_to_each_rank() -> None:
    assert DDPStrategy(accelerator="cpu").training_semantics.buffer_updates == "broadcast"
    leaves = DDPStrategy(accelerator="cpu", broadcast_buffers=False).training_semantics
    assert leaves.buffer_updates == "own"
    assert FSDPStrategy(accelerator="cpu").training_semantics.buffer_updates == "own"
