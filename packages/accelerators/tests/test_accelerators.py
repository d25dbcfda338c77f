from collections.abc import Iterator

import pytest
import torch
from typing_extensions import override

from plait.accelerators import (
    CPUAccelerator,
    CUDAAccelerator,
    MPSAccelerator,
    TPUAccelerator,
    XLAAccelerator,
    auto_accelerator,
    available_accelerators,
)
from plait.core import (
    Accelerator,
    AcceleratorRegistry,
    ConfigurationError,
    MissingDependencyError,
    SupportsDeviceStats,
)


def test_every_name_the_design_promises_is_registered() -> None:
    assert set(AcceleratorRegistry.available_accelerators()) == {
        "auto",
        "cpu",
        "cuda",
        "gpu",
        "mps",
        "tpu",
        "xla",
    }
    assert all(e.source == "plait-accelerators" for e in AcceleratorRegistry.entries())


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("cpu", CPUAccelerator),
        ("CUDA", CUDAAccelerator),
        ("gpu", CUDAAccelerator),
        ("mps", MPSAccelerator),
        ("xla", XLAAccelerator),
        ("tpu", XLAAccelerator),
    ],
)
def test_names_build_their_accelerator(name: str, kind: type) -> None:
    accelerator = AcceleratorRegistry.get(name)

    assert type(accelerator) is kind
    assert isinstance(accelerator, Accelerator)


def test_lightnings_older_name_of_the_xla_accelerator_is_the_same_class() -> None:
    assert TPUAccelerator is XLAAccelerator
    assert type(AcceleratorRegistry.get("tpu")) is TPUAccelerator


def test_the_cpu_runs_n_processes_on_the_cpu() -> None:
    cpu = CPUAccelerator()

    assert cpu.is_available()
    assert cpu.auto_device_count() == 1
    assert cpu.parse_devices(3) == (0, 1, 2)
    assert cpu.get_parallel_devices((0, 1, 2)) == [torch.device("cpu")] * 3
    cpu.setup_device(torch.device("cpu"))
    cpu.teardown()


def test_setting_up_a_device_of_another_type_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="cannot set up the device cuda:0"):
        CPUAccelerator().setup_device(torch.device("cuda", 0))


def test_auto_chooses_the_best_available() -> None:
    best = auto_accelerator()

    assert best.name == available_accelerators()[0]
    assert AcceleratorRegistry.get("auto").name == best.name
    assert available_accelerators()[-1] == "cpu"


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="this machine has a CUDA device")
def test_an_unavailable_accelerator_names_the_available_ones() -> None:
    with pytest.raises(ConfigurationError, match="'cuda' is not available") as caught:
        CUDAAccelerator().parse_devices(1)

    assert "cpu" in caught.value.choices
    assert caught.value.fix is not None
    assert "accelerator='" in caught.value.fix


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
def test_mps_without_apple_silicon_is_unavailable() -> None:
    mps = MPSAccelerator()

    assert not mps.is_available()
    assert mps.auto_device_count() == 0
    with pytest.raises(ConfigurationError, match="'mps' is not available"):
        mps.parse_devices("auto")


def test_xla_without_a_working_torch_xla_explains_itself() -> None:
    xla = XLAAccelerator()

    assert not xla.is_available()
    assert xla.device_count() == 0
    with pytest.raises((MissingDependencyError, ConfigurationError)) as caught:
        xla.parse_devices(1)
    if isinstance(caught.value, MissingDependencyError):
        assert caught.value.install == "plait-accelerators[xla]"


@pytest.mark.cuda
def test_cuda_devices_are_indexed_and_set_up() -> None:
    cuda = CUDAAccelerator()
    count = torch.cuda.device_count()

    assert cuda.parse_devices(-1) == tuple(range(count))
    device = cuda.get_parallel_devices((count - 1,))[0]
    cuda.setup_device(device)
    assert torch.cuda.current_device() == count - 1
    assert isinstance(cuda, SupportsDeviceStats)
    held = torch.ones(1, device=device)
    assert cuda.get_device_stats(device)["allocated_bytes.all.current"] > 0
    del held
    cuda.teardown()


class FakeGPU(CPUAccelerator):
    """A plugin's accelerator: here, the CPU under another name."""

    name = "fakegpu"


class MissingGPU(CPUAccelerator):
    name = "missinggpu"

    @override
    def is_available(self) -> bool:
        return False


@pytest.fixture
def plugin_accelerators() -> Iterator[None]:
    AcceleratorRegistry.register("fakegpu", FakeGPU)
    AcceleratorRegistry.register("missinggpu", MissingGPU)
    try:
        yield
    finally:
        AcceleratorRegistry.remove("fakegpu")
        AcceleratorRegistry.remove("missinggpu")


@pytest.mark.usefixtures("plugin_accelerators")
def test_auto_asks_the_registry_and_prefers_a_plugins_accelerator() -> None:
    assert auto_accelerator().name == "fakegpu"
    assert available_accelerators()[0] == "fakegpu"
    assert "missinggpu" not in available_accelerators()
    with pytest.raises(ConfigurationError, match="'missinggpu' is not available") as caught:
        MissingGPU().require_available()
    assert "fakegpu" in caught.value.choices
