"""The Protocols are small, structural and checkable at run time.

The classes below implement each Protocol the plainest way, in one process. Assigning
them to variables of the Protocol types makes mypy prove they conform; the
``isinstance`` checks prove the runtime checks that the composition root relies on.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import ParamSpec, TypeVar, overload

import pytest
import torch
from typing_extensions import get_protocol_members

from plait.core import (
    Accelerator,
    CheckpointIO,
    ClusterEnvironment,
    Collectives,
    GradientClipAlgorithm,
    Launcher,
    Precision,
    ProcessLayout,
    ReduceOp,
    Strategy,
    SupportsAsyncCheckpoint,
    SupportsDeviceStats,
    SupportsLauncher,
    SupportsNoSync,
)
from plait.core.typing import (
    Checkpoint,
    DeviceSpec,
    Group,
    PathLike,
    ReduceOpLike,
    StateDict,
)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


class OneCPU:
    name = "cpu"

    def is_available(self) -> bool:
        return True

    def auto_device_count(self) -> int:
        return 1

    def parse_devices(self, spec: DeviceSpec) -> tuple[int, ...]:
        return (0,)

    def get_parallel_devices(self, devices: tuple[int, ...]) -> list[torch.device]:
        return [torch.device("cpu") for _ in devices]

    def setup_device(self, device: torch.device) -> None:
        pass

    def teardown(self) -> None:
        pass


class FullPrecision:
    @property
    def param_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def reduce_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def needs_scaler(self) -> bool:
        return False

    def convert_module(self, module: ModuleT) -> ModuleT:
        return module

    def forward_context(self) -> AbstractContextManager[object]:
        return nullcontext()

    def convert_input(self, data: T) -> T:
        return data

    def convert_output(self, data: T) -> T:
        return data

    def backward(self, tensor: torch.Tensor, module: torch.nn.Module | None) -> None:
        torch.autograd.backward(tensor)

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], object] | None = None
    ) -> object:
        return optimizer.step()

    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> None:
        torch.nn.utils.clip_grad_norm_(module.parameters(), clip_val)

    def state_dict(self) -> StateDict:
        return {}

    def load_state_dict(self, state_dict: StateDict) -> None:
        pass


class InMemoryCheckpointIO:
    def __init__(self) -> None:
        self.files: dict[str, Checkpoint] = {}

    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        self.files[str(path)] = dict(checkpoint)

    def load_checkpoint(
        self, path: PathLike, map_location: torch.device | str | None = None
    ) -> Checkpoint:
        return self.files[str(path)]

    def remove_checkpoint(self, path: PathLike) -> None:
        del self.files[str(path)]

    def teardown(self) -> None:
        pass

    def wait(self) -> None:
        pass


class SingleProcessEnvironment:
    creates_processes_externally = False
    main_address = "127.0.0.1"
    main_port = 0
    world_size = 1
    global_rank = 0
    local_rank = 0
    node_rank = 0

    def detect(self) -> bool:
        return True

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        pass


class InlineLauncher:
    is_interactive_compatible = True

    def launch(self, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        return function(*args, **kwargs)


class SoloStrategy:
    """One process: every collective is the identity, as the contract says for world size 1."""

    def __init__(self) -> None:
        self.accelerator = OneCPU()
        self.precision = FullPrecision()
        self.checkpoint_io = InMemoryCheckpointIO()
        self.launcher = InlineLauncher()
        self.root_device = torch.device("cpu")
        self.world_size = 1
        self.global_rank = 0
        self.is_global_zero = True

    @overload
    def reduce(
        self, value: torch.Tensor, group: Group | None = None, reduce_op: ReduceOpLike = "mean"
    ) -> torch.Tensor: ...

    @overload
    def reduce(
        self, value: float, group: Group | None = None, reduce_op: ReduceOpLike = "mean"
    ) -> float: ...

    def reduce(
        self,
        value: torch.Tensor | float,
        group: Group | None = None,
        reduce_op: ReduceOpLike = "mean",
    ) -> torch.Tensor | float:
        op = ReduceOp.parse(reduce_op)
        if isinstance(value, torch.Tensor):
            if op is ReduceOp.MEAN and not value.is_floating_point():
                return value.to(torch.get_default_dtype())
            return value.clone()
        return value

    def broadcast(self, obj: T, src: int = 0, group: Group | None = None) -> T:
        if src != 0:
            raise ValueError(f"src {src} is outside [0, 1)")
        return obj

    def barrier(
        self,
        name: str | None = None,
        timeout: timedelta | float | None = None,
        group: Group | None = None,
    ) -> None:
        pass

    def all_gather(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        return tensor.unsqueeze(0).clone()

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002
        return decision

    def setup_environment(self) -> None:
        pass

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(self.root_device)

    def setup_optimizers(
        self, optimizers: Sequence[torch.optim.Optimizer]
    ) -> list[torch.optim.Optimizer]:
        return list(optimizers)

    def setup_module_and_optimizers(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> tuple[torch.nn.Module, list[torch.optim.Optimizer]]:
        return self.setup_module(module), self.setup_optimizers(optimizers)

    @property
    def layout(self) -> ProcessLayout:
        return ProcessLayout.single_process()

    def unwrap_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def training_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        return module(*args, **kwargs)

    def validation_step(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        with torch.no_grad():
            return module(*args, **kwargs)

    test_step = validation_step
    predict_step = validation_step

    def backward(self, loss: torch.Tensor, module: torch.nn.Module | None = None) -> None:
        self.precision.backward(loss, module)

    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> None:
        self.precision.clip_gradients(module, optimizer, clip_val, algorithm)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()

    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        return {
            "state_dict": module.state_dict(),
            "optimizer_states": [optimizer.state_dict() for optimizer in optimizers],
        }

    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        module_state = state["state_dict"]
        assert isinstance(module_state, Mapping)
        module.load_state_dict(module_state)

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], object] | None = None
    ) -> object:
        return self.precision.optimizer_step(optimizer, closure)

    def save_checkpoint(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        self.checkpoint_io.save_checkpoint(checkpoint, path)

    def load_checkpoint(
        self,
        path: PathLike,
        state: torch.nn.Module | Mapping[str, object] | None = None,
        *,
        weights_only: bool = False,
    ) -> Checkpoint:
        checkpoint = self.read_checkpoint(path)
        if isinstance(state, torch.nn.Module):
            self.set_state_dict(state, [], checkpoint)
            return {key: value for key, value in checkpoint.items() if key != "state_dict"}
        return checkpoint

    def read_checkpoint(
        self, path: PathLike, module: torch.nn.Module | None = None, *, weights_only: bool = False
    ) -> Checkpoint:
        return self.checkpoint_io.load_checkpoint(path, self.root_device)

    def setup_dataloader(
        self,
        loader: Iterable[T],
        *,
        evaluation: bool = False,
        move_to_device: bool = False,
        use_distributed_sampler: bool = True,
    ) -> Iterable[T]:
        return loader  # one process reads it all

    def export_checkpoint(self, module: torch.nn.Module, path: PathLike) -> None:
        self.checkpoint_io.save_checkpoint({"state_dict": module.state_dict()}, path)

    def no_sync(
        self, module: torch.nn.Module, enabled: bool = True
    ) -> AbstractContextManager[None]:
        return nullcontext()  # one process: backward never synchronises

    def remove_checkpoint(self, path: PathLike) -> None:
        self.checkpoint_io.remove_checkpoint(path)

    def on_exception(self, exception: BaseException) -> None:
        pass

    def teardown(self) -> None:
        pass


# mypy proves each assignment: the implementations conform structurally.
accelerator: Accelerator = OneCPU()
precision: Precision = FullPrecision()
checkpoint_io: CheckpointIO = InMemoryCheckpointIO()
async_checkpoint_io: SupportsAsyncCheckpoint = InMemoryCheckpointIO()
environment: ClusterEnvironment = SingleProcessEnvironment()
launcher: Launcher = InlineLauncher()
strategy: Strategy = SoloStrategy()
collectives: Collectives = SoloStrategy()
no_sync: SupportsNoSync = SoloStrategy()
launches: SupportsLauncher = SoloStrategy()


@pytest.mark.parametrize(
    ("instance", "protocol"),
    [
        (accelerator, Accelerator),
        (precision, Precision),
        (checkpoint_io, CheckpointIO),
        (async_checkpoint_io, SupportsAsyncCheckpoint),
        (environment, ClusterEnvironment),
        (launcher, Launcher),
        (strategy, Strategy),
        (strategy, Collectives),
        (strategy, SupportsNoSync),
        (strategy, SupportsLauncher),
    ],
    ids=lambda value: getattr(value, "__name__", type(value).__name__),
)
def test_implementations_pass_the_runtime_check(instance: object, protocol: type) -> None:
    assert isinstance(instance, protocol)


@pytest.mark.parametrize(
    ("instance", "protocol"),
    [
        (OneCPU(), SupportsDeviceStats),
        (FullPrecision(), Accelerator),
        (SingleProcessEnvironment(), Strategy),
        (InlineLauncher(), SupportsNoSync),
    ],
    ids=lambda value: getattr(value, "__name__", type(value).__name__),
)
def test_objects_lacking_a_member_fail_the_runtime_check(instance: object, protocol: type) -> None:
    assert not isinstance(instance, protocol)


def test_a_strategy_is_a_collectives_and_more() -> None:
    assert get_protocol_members(Collectives) < get_protocol_members(Strategy)
    assert {"reduce", "broadcast", "barrier", "all_gather", "reduce_boolean_decision"} == set(
        get_protocol_members(Collectives)
    )


@pytest.mark.parametrize(
    "protocol",
    [Accelerator, Precision, CheckpointIO, ClusterEnvironment, Collectives, Launcher, Strategy],
)
def test_protocols_stay_small_and_documented(protocol: type) -> None:
    members = get_protocol_members(protocol)

    # The strategy owns every step, every state and a loop's data and accumulation
    # (the seam a sharding strategy meets, and all a loop of one's own calls); the
    # other parts do one job each.
    assert len(members) <= (40 if protocol is Strategy else 25)
    assert protocol.__doc__
    for member in members:
        assert getattr(protocol, member).__doc__, f"{protocol.__name__}.{member} is undocumented"


def test_the_standalone_loop_runs_through_the_protocol() -> None:
    torch.manual_seed(0)
    solo: Strategy = SoloStrategy()
    solo.setup_environment()
    model = solo.setup_module(torch.nn.Linear(3, 1))
    [optimizer] = solo.setup_optimizers([torch.optim.SGD(model.parameters(), lr=0.1)])
    batch = torch.randn(8, 3)

    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        with solo.precision.forward_context():
            loss = model(batch).pow(2).mean()
        solo.backward(loss, model)
        solo.optimizer_step(optimizer)
        losses.append(solo.reduce(loss.detach(), reduce_op="mean").item())
    solo.save_checkpoint({"model": model.state_dict()}, "memory://last.pt")
    restored = solo.load_checkpoint("memory://last.pt")
    solo.teardown()

    assert losses == sorted(losses, reverse=True)
    assert torch.equal(restored["model"]["weight"], model.state_dict()["weight"])
