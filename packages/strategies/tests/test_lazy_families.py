"""A process imports the strategy families it uses, and none of the others.

``import plait.strategies`` and a registered name of one process or the DDP family
import neither FSDP, DeepSpeed, XLA nor the model-parallel mesh; naming one of those
(by its class or its registered name) imports it then.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from plait.core import StrategyRegistry

_FAMILIES = (
    "plait.strategies.deepspeed",
    "plait.strategies.dp",
    "plait.strategies.fsdp",
    "plait.strategies.mesh",
    "plait.strategies.model_parallel",
    "plait.strategies.sharded",
    "plait.strategies.xla",
)

_PROBE = textwrap.dedent(
    """
    import json, sys
    import plait.strategies
    from plait.core import StrategyRegistry

    def loaded():
        return sorted(m for m in {families} if m in sys.modules)

    seen = {{"import": loaded()}}
    StrategyRegistry.get("ddp", accelerator="cpu")
    StrategyRegistry.get("single_device", device="cpu")
    seen["ddp"] = loaded()
    assert StrategyRegistry.entry("fsdp").description  # listed, described
    seen["listed"] = loaded()
    from plait.strategies import FSDPStrategy
    seen["named"] = loaded()
    StrategyRegistry.get("deepspeed_stage_2", accelerator="cpu")
    seen["deepspeed"] = loaded()
    print(json.dumps(seen))
    """
)


@pytest.mark.slow
def test_only_the_families_a_process_names_are_imported() -> None:
    probe = _PROBE.format(families=repr(_FAMILIES))
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen["import"] == []
    assert seen["ddp"] == []
    assert seen["listed"] == []
    # FSDP's module stands on the mesh's.
    assert seen["named"] == ["plait.strategies.fsdp", "plait.strategies.mesh"]
    assert "plait.strategies.deepspeed" in seen["deepspeed"]


def test_every_family_is_still_named_by_the_package_and_the_registry() -> None:
    from plait import strategies  # noqa: PLC0415

    for name in strategies.__all__:
        assert getattr(strategies, name) is not None, name
    assert "FSDPStrategy" in dir(strategies)
    with pytest.raises(AttributeError, match="has no attribute 'FSDPStrategi'"):
        strategies.FSDPStrategi  # type: ignore[attr-defined]  # noqa: B018
    assert StrategyRegistry.entry("fsdp").factory is strategies.FSDPStrategy
    assert StrategyRegistry.entry("xla").factory is strategies.XLAStrategy
