"""Each package installs, imports and depends as DESIGN.md's dependency rule says."""

import importlib.metadata
import importlib.resources
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
PACKAGES = sorted(path.name for path in (REPO / "packages").iterdir() if path.is_dir())
PARTS = {"accelerators", "precision", "checkpoint_io", "environments", "strategies", "conformance"}
CORE_THIRD_PARTY = {"torch", "attrs", "typing-extensions"}


def distribution(package: str) -> str:
    return "plait-" + package.replace("_", "-")


def requirements(package: str) -> list[Requirement]:
    return [Requirement(text) for text in importlib.metadata.requires(distribution(package)) or []]


def test_the_repository_has_the_eight_packages_of_the_design() -> None:
    assert set(PACKAGES) == {"core", "trainer", *PARTS}


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_is_a_typed_portion_of_the_plait_namespace(package: str) -> None:
    source = REPO / "packages" / package / "src"

    assert not (source / "plait" / "__init__.py").exists()
    assert (source / "plait" / package / "__init__.py").is_file()
    assert importlib.resources.files(f"plait.{package}").joinpath("py.typed").is_file()
    assert (REPO / "packages" / package / "tests").is_dir()


def loaded_after_import(package: str) -> list[str]:
    probe = (
        f"import sys, json, plait.{package}; "
        "print(json.dumps([m for m in sys.modules if m == 'torch' or m.startswith('plait.')]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=60
    )
    loaded: list[str] = json.loads(result.stdout)
    return loaded


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_a_package_loads_no_sibling(package: str) -> None:
    loaded = loaded_after_import(package)

    allowed = {"core", package} if package != "trainer" else set(PACKAGES)
    assert {name.split(".")[1] for name in loaded if name != "torch"} <= allowed


def test_importing_core_does_not_import_torch() -> None:
    assert "torch" not in loaded_after_import("core")


def test_importing_the_trainer_leaves_its_display_and_logging_libraries_for_later() -> None:
    # rich (the progress bar) and tensorboard load when first used: half the cost
    # of importing plait.trainer after torch was rich's.
    probe = "import sys, json, plait.trainer; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=60
    )
    roots = {name.split(".")[0] for name in json.loads(result.stdout)}

    assert roots.isdisjoint({"rich", "tensorboard"})


@pytest.mark.parametrize("package", PACKAGES)
def test_package_metadata_keeps_the_dependency_rule(package: str) -> None:
    # What an extra brings (plait-strategies[parts]) is the user's choice, not a rule.
    required = {
        req.name
        for req in requirements(package)
        if req.marker is None or "extra" not in str(req.marker)
    }
    siblings = {name for name in required if name.startswith("plait-")}

    if package == "core":
        assert siblings == set()
        assert required <= CORE_THIRD_PARTY
    elif package in PARTS:
        assert siblings == {"plait-core"}
    else:
        assert "plait-core" in siblings


@pytest.mark.parametrize("package", PACKAGES)
def test_torch_is_a_floor_never_a_pin(package: str) -> None:
    for req in requirements(package):
        if req.name == "torch":
            assert [spec.operator for spec in req.specifier] == [">="]
