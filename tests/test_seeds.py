"""Every code block of the documents plait re-creates runs on plait as written.

Each block below is the document's code with only its import lines changed
(``lightning.pytorch`` / ``pytorch_lightning`` -> the plait package that holds the
name; the typing names its annotations use imported). Its placeholders
(``MyCustomDistributedDataParallel``, ``MyAccelerator``, ...) are small classes of
this module. A block runs statement by statement: every statement must succeed,
except one that asks for hardware this machine lacks, which must fail at once with
the error that names it. Where plait differs on purpose, ``docs/guide/migrating.md``
says so, and the statement's expected error is listed in ``DIFFERENCES``.
"""

from __future__ import annotations

import ast
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.accelerators import CPUAccelerator
from plait.core import ConfigurationError, StrategyRegistry
from plait.precision import TruePrecision
from plait.trainer import Module

# From 000/001 (strategies): selecting a built-in strategy.
SELECTING: Final = """
from plait.strategies import DDPStrategy
from plait.trainer import Trainer

# Training with the DistributedDataParallel strategy on 4 GPUs
trainer = Trainer(strategy="ddp", accelerator="gpu", devices=4)
# Training with the DistributedDataParallel strategy on 4 GPUs, with options configured
trainer = Trainer(strategy=DDPStrategy(static_graph=True), accelerator="gpu", devices=4)
# Training with the DDP Spawn strategy using auto accelerator selection
trainer = Trainer(strategy="ddp_spawn", accelerator="auto", devices=4)
# Training with the DeepSpeed strategy on available GPUs
trainer = Trainer(strategy="deepspeed", accelerator="gpu", devices="auto")
# Training with the DDP strategy using 3 CPU processes
trainer = Trainer(strategy="ddp", accelerator="cpu", devices=3)
# Training with the DDP Spawn strategy on 8 TPU cores
trainer = Trainer(strategy="ddp_spawn", accelerator="tpu", devices=8)
"""

# From 000/001: a custom strategy, then passed to the Trainer, then with its own parts.
CUSTOM_STRATEGY: Final = """
from plait.strategies import DDPStrategy
from plait.trainer import Trainer

class CustomDDPStrategy(DDPStrategy):
    def configure_ddp(self):
        self.model = MyCustomDistributedDataParallel(
            self.model,
            device_ids=...,
        )

    def setup(self, trainer):
        # you can access the accelerator and plugins directly
        self.accelerator.setup()
        self.precision_plugin.connect(...)

# custom strategy
trainer = Trainer(strategy=CustomDDPStrategy())

# custom strategy, with new accelerator and plugins
accelerator = MyAccelerator()
precision_plugin = MyPrecisionPlugin()
strategy = CustomDDPStrategy(accelerator=accelerator, precision_plugin=precision_plugin)
trainer = Trainer(strategy=strategy)
"""

# From 001: the strategy registry, and a registered variant with a custom CheckpointIO.
REGISTRY: Final = """
from typing import Any, Dict, Union
from pathlib import Path
from plait.trainer import Trainer

# Training with the DDP Strategy
trainer = Trainer(strategy="ddp", accelerator="gpu", devices=4)
# Training with DeepSpeed ZeRO Stage 3 and CPU Offload
trainer = Trainer(strategy="deepspeed_stage_3_offload", accelerator="gpu", devices=3)
# Training with the TPU Spawn Strategy with `debug` as True
trainer = Trainer(strategy="xla_debug", accelerator="tpu", devices=8)

from plait.strategies import DDPStrategy, StrategyRegistry, CheckpointIO

class CustomCheckpointIO(CheckpointIO):
    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Union[str, Path]) -> None:
        ...

    def load_checkpoint(self, path: Union[str, Path]) -> Dict[str, Any]:
        ...

custom_checkpoint_io = CustomCheckpointIO()

# Register the DDP Strategy with your custom CheckpointIO plugin
StrategyRegistry.register(
    "ddp_custom_checkpoint_io",
    DDPStrategy,
    description="DDP Strategy with custom checkpoint io plugin",
    checkpoint_io=custom_checkpoint_io,
)

trainer = Trainer(strategy="ddp_custom_checkpoint_io", accelerator="gpu", devices=2)
"""

# From 003 (plugins): plugins chosen from the Trainer's arguments, a custom plugin.
PLUGINS: Final = """
from plait.strategies import DDPStrategy
from plait.trainer import Trainer

# accelerator: GPUAccelerator
# training strategy: DDPStrategy
# precision: NativeMixedPrecisionPlugin
trainer = Trainer(gpus=4, precision=16)

class CustomDDPStrategy(DDPStrategy):
    def configure_ddp(self):
        self._model = MyCustomDistributedDataParallel(
            self.model,
            device_ids=...,
        )

# custom plugins
trainer = Trainer(strategy=CustomDDPStrategy(), plugins=[CustomPrecisionPlugin()])

# fully custom accelerator and plugins
accelerator = MyAccelerator()
precision_plugin = MyPrecisionPlugin()
training_type_plugin = CustomDDPStrategy(accelerator=accelerator, precision_plugin=precision_plugin)
trainer = Trainer(strategy=training_type_plugin)
"""

BLOCKS: Final = {
    "selecting": SELECTING,
    "custom_strategy": CUSTOM_STRATEGY,
    "registry": REGISTRY,
    "plugins": PLUGINS,
}

_BLOCK_MODULE: Final = "seed_block"

DIFFERENCES: Final = {
    # Lightning 1.x's gpus= is accelerator="gpu", devices=N (see the migration guide).
    "Trainer(gpus=4, precision=16)": (TypeError, "unexpected keyword argument 'gpus'"),
}
"""Statements plait refuses on purpose, with the error they raise."""


class MyCustomDistributedDataParallel(DistributedDataParallel):
    """A wrapper of the user's own: DDP, counting the modules it wraps."""

    wrapped = 0

    def __init__(self, module: torch.nn.Module, device_ids: object = None) -> None:
        # The documents' device_ids=... is a placeholder: the CPU takes none.
        super().__init__(module)
        MyCustomDistributedDataParallel.wrapped += 1


class MyAccelerator(CPUAccelerator):
    """An accelerator of the user's own: the CPU."""


class MyPrecisionPlugin(TruePrecision):
    """A precision plugin of the user's own: 64-bit."""

    def __init__(self) -> None:
        super().__init__("64-true")


class CustomPrecisionPlugin(MyPrecisionPlugin):
    """Another precision plugin of the user's own."""


def _missing_hardware(statement: str, error: BaseException) -> bool:
    """Whether ``statement`` asks for devices this machine lacks, as ``error`` says."""
    wanted = re.search(r'accelerator="(gpu|tpu)", devices=(\d+|"auto")', statement)
    if wanted is None or not isinstance(error, ConfigurationError):
        return False
    kind, count = wanted.groups()
    if kind == "gpu":
        needed = 1 if count == '"auto"' else int(count)
        return torch.cuda.device_count() < needed and "cuda" in str(error)
    return "not available" in str(error) and "xla" in str(error)


def _statements(block: str) -> Iterator[tuple[str, ast.Module]]:
    for node in ast.parse(block).body:
        source = ast.get_source_segment(block, node)
        assert source is not None
        yield source, ast.Module(body=[node], type_ignores=[])


def _run(module: ast.Module, namespace: dict[str, Any]) -> BaseException | None:
    try:
        exec(compile(module, "<seed>", "exec"), namespace)
    except (ConfigurationError, TypeError) as error:
        return error
    return None


def run_block(block: str) -> dict[str, Any]:
    """Run ``block`` statement by statement, as the module ``seed_block``; its namespace.

    The classes it defines pickle by reference to ``seed_block`` (a strategy travels
    to its ranks so), which stays in `sys.modules` until the test ends.
    """
    module = types.ModuleType(_BLOCK_MODULE)
    sys.modules[_BLOCK_MODULE] = module
    namespace = vars(module)
    namespace.update(
        MyCustomDistributedDataParallel=MyCustomDistributedDataParallel,
        MyAccelerator=MyAccelerator,
        MyPrecisionPlugin=MyPrecisionPlugin,
        CustomPrecisionPlugin=CustomPrecisionPlugin,
    )
    for source, statement in _statements(block):
        difference = next((v for k, v in DIFFERENCES.items() if k in source), None)
        error = _run(statement, namespace)
        if error is None:
            assert difference is None, f"{source} ran, and plait was to refuse it"
        elif difference is not None:
            kind, message = difference
            assert isinstance(error, kind), source
            assert message in str(error), (source, str(error))
        else:
            assert _missing_hardware(source, error), f"{source}\nraised {error!r}"
    return namespace


@pytest.fixture(autouse=True)
def _left_as_found() -> Iterator[None]:
    before = set(StrategyRegistry.available_strategies())
    yield
    for name in set(StrategyRegistry.available_strategies()) - before:
        StrategyRegistry.remove(name)
    sys.modules.pop(_BLOCK_MODULE, None)


class Tiny(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        x, y = batch
        loss: torch.Tensor = torch.nn.functional.mse_loss(self.layer(x), y)
        return loss

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    x = torch.randn(8, 2)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def test_selecting_a_built_in_strategy_by_name_or_instance() -> None:
    namespace = run_block(SELECTING)

    # The last statement that this machine runs: three CPU processes of DDP.
    assert type(namespace["trainer"].strategy).__name__ == "DDPStrategy"


def test_a_custom_strategy_that_sets_self_model_in_configure_ddp_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the Trainer writes its logs and checkpoints here
    namespace = run_block(CUSTOM_STRATEGY)
    strategy = namespace["strategy"]
    assert isinstance(strategy.accelerator, MyAccelerator)
    assert isinstance(strategy.precision_plugin, MyPrecisionPlugin)  # honoured, not dropped
    trainer = namespace["trainer"]
    assert trainer.strategy.precision.param_dtype == torch.float64

    trainer.max_epochs = 1  # the documents' Trainer() trains for the default 1000 epochs

    before = MyCustomDistributedDataParallel.wrapped
    trainer.fit(Tiny(), _loader())

    assert MyCustomDistributedDataParallel.wrapped == before + 1
    assert trainer.global_step == 2


def test_a_registered_variant_with_a_custom_checkpoint_io() -> None:
    namespace = run_block(REGISTRY)
    from plait.trainer import Trainer  # noqa: PLC0415 (what the block imported)

    on_cpu = Trainer(strategy="ddp_custom_checkpoint_io", accelerator="cpu", devices=1)

    assert on_cpu.strategy.checkpoint_io is namespace["custom_checkpoint_io"]


def test_custom_plugins_given_to_the_trainer_are_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = run_block(PLUGINS)
    assert isinstance(namespace["trainer"].strategy.precision, MyPrecisionPlugin)
    from plait.trainer import Trainer  # noqa: PLC0415 (what the block imported)

    with_plugin = Trainer(
        strategy=namespace["CustomDDPStrategy"](), plugins=[CustomPrecisionPlugin()]
    )
    assert isinstance(with_plugin.strategy.precision, CustomPrecisionPlugin)

    namespace["trainer"].max_epochs = 1
    before = MyCustomDistributedDataParallel.wrapped
    namespace["trainer"].fit(Tiny(), _loader())

    assert MyCustomDistributedDataParallel.wrapped == before + 1
