"""The import-linter contracts fail when a package breaks the dependency rule.

Each case copies every package's sources, adds one import to one module, and runs
lint-imports with the repository's contracts over the copy.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
LAYERS = "The dependency rule"
CORE_SMALL = "plait.core stays small"
FAMILIES = "Inside plait.strategies, the generic modules never import a strategy family"
STRATEGY_LAYERS = "Inside plait.strategies, the families stand on the mesh"
ENGINE = "Inside plait.conformance, the engine knows no kind of example"
KIT = "Inside the training kit, each property's kind stands on the base kind"
TRAINER = "The Trainer imports no strategy family"
DEEPSPEED = "Inside the DeepSpeed family, the strategy stands on its checkpoint IO"
TRAINER_FACE = "The Trainer's values, metrics, results, loggers"
CONTRACTS = 9
CYCLES = REPO / "tools" / "import-cycles.toml"


def lint_with_extra_import(
    tmp_path: Path, module: str, statement: str, config: Path = REPO / "pyproject.toml"
) -> tuple[int, str]:
    sources = []
    for package in sorted((REPO / "packages").iterdir()):
        target = tmp_path / package.name
        shutil.copytree(package / "src", target, ignore=shutil.ignore_patterns("__pycache__"))
        sources.append(str(target))
    path = tmp_path / module.split(".")[1] / Path(*module.split(".")) / "__init__.py"
    if not path.exists():
        path = path.parent.with_suffix(".py")
    path.write_text(path.read_text() + f"\n{statement}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sources)}
    result = subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "statement", "broken"),
    [
        # Through core, every generic strategy module would reach the families too
        # (and DeepSpeed's Protocols, through core, its strategy).
        (
            "plait.core.registry",
            "import plait.strategies",
            {LAYERS, CORE_SMALL, FAMILIES, STRATEGY_LAYERS, DEEPSPEED},
        ),
        ("plait.strategies", "from plait import accelerators", {LAYERS}),
        ("plait.conformance", "import plait.trainer", {LAYERS}),
        ("plait.core.seed", "import rich", {CORE_SMALL}),
        ("plait.core.rank", "import torch_xla", {CORE_SMALL}),
        # The cycle checkpoints once made: the generic base reaching DeepSpeed's export.
        (
            "plait.strategies.base",
            "import plait.strategies.deepspeed.export",
            {FAMILIES, STRATEGY_LAYERS},
        ),
        # Indirectly too: a generic module importing one that imports a family.
        ("plait.strategies.state", "import plait.strategies.mesh", {FAMILIES, STRATEGY_LAYERS}),
        # The circle the mesh once made, through FSDP's package; and one family on another.
        ("plait.strategies.mesh", "import plait.strategies.fsdp.parallelize", {STRATEGY_LAYERS}),
        ("plait.strategies.fsdp.strategy", "import plait.strategies.deepspeed", {STRATEGY_LAYERS}),
        # The engine learning of a kind, or of the training kit, by an import.
        ("plait.conformance.worker", "import plait.conformance.kinds.reduce", {ENGINE}),
        # (the kit's examples then reach the kit's top through the engine)
        ("plait.conformance.properties", "import plait.conformance.training", {ENGINE, KIT}),
        # An example of the kit standing on another, or the loop on an example.
        ("plait.conformance.training.resume", "import plait.conformance.training.moves", {KIT}),
        ("plait.conformance.training.loop", "import plait.conformance.training.replicas", {KIT}),
        # The plugin and the suite importing each other again.
        ("plait.conformance.suite", "import plait.conformance.plugin", {ENGINE}),
        # The Trainer switching on a family's class again, where a Protocol says it.
        ("plait.trainer.optimization", "import plait.strategies.pipeline", {TRAINER}),
        # The Trainer's circle growing again: the metrics naming the module's class
        # (as they did for its logged values' types), or a logger a callback.
        ("plait.trainer.metrics", "import plait.trainer.module", {TRAINER_FACE}),
        ("plait.trainer.loggers.base", "import plait.trainer.callbacks.base", {TRAINER_FACE}),
        # DeepSpeed's checkpoint IO reaching back to its strategy.
        (
            "plait.strategies.deepspeed.checkpoint_io",
            "import plait.strategies.deepspeed.strategy",
            {DEEPSPEED},
        ),
    ],
)
def test_a_deliberate_violation_breaks_its_contract(
    tmp_path: Path, module: str, statement: str, broken: set[str]
) -> None:
    code, output = lint_with_extra_import(tmp_path, module, statement)

    assert code == 1, output
    for contract in broken:
        assert f"{contract}" in output
    assert f"Contracts: {CONTRACTS - len(broken)} kept, {len(broken)} broken." in output


@pytest.mark.slow
def test_a_module_that_imports_itself_back_at_run_time_is_named_with_the_import(
    tmp_path: Path,
) -> None:
    # A run's set-up naming the Trainer at run time, where it imports the Trainer for
    # its types only: the Trainer imports the set-up, so a circle.
    code, output = lint_with_extra_import(
        tmp_path, "plait.trainer.attach", "import plait.trainer.trainer", CYCLES
    )

    assert code == 1, output
    assert "No cycles are allowed in plait.trainer." in output
    # The import it names to remove is one of the two that close the circle.
    assert re.search(r"- \.(attach -> \.trainer|trainer -> \.attach) \(1 import\)", output)
    # Imports for type checking alone do not count here (pyproject.toml's contracts
    # count them): the Trainer's public classes name each other, as Lightning's do.
    code, output = lint_with_extra_import(
        tmp_path / "typing",
        "plait.trainer.values",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import plait.trainer.trainer",
        CYCLES,
    )
    assert code == 0, output
    assert "Contracts: 2 kept, 0 broken." in output


@pytest.mark.slow
def test_the_trainer_may_import_every_part(tmp_path: Path) -> None:
    code, output = lint_with_extra_import(
        tmp_path, "plait.trainer", "import plait.strategies, plait.accelerators, plait.core"
    )

    assert code == 0, output
    assert f"Contracts: {CONTRACTS} kept, 0 broken." in output
