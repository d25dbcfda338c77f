import pytest

from plait.core import MissingDependencyError, is_module_available, require_module


def test_an_installed_module_is_imported() -> None:
    assert require_module("json", feature="reading", install="json").dumps([]) == "[]"


def test_a_missing_module_names_the_feature_and_what_to_install() -> None:
    with pytest.raises(MissingDependencyError) as caught:
        require_module(
            "plait_no_such_backend",
            feature="the 'deepspeed' strategy",
            install="plait-strategies[deepspeed]",
        )

    assert caught.value.module == "plait_no_such_backend"
    assert "the 'deepspeed' strategy needs the module 'plait_no_such_backend'" in str(caught.value)
    assert "pip install 'plait-strategies[deepspeed]'" in str(caught.value)
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


@pytest.mark.parametrize(
    ("module", "available"),
    [("json", True), ("plait_no_such_backend", False), ("plait_no_such_parent.child", False)],
)
def test_availability_is_known_without_importing(module: str, available: bool) -> None:
    assert is_module_available(module) is available
