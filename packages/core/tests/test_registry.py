import textwrap
import uuid
from pathlib import Path
from typing import Protocol, runtime_checkable

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.core import ConfigurationError, MissingDependencyError, Registry


@runtime_checkable
class Widget(Protocol):
    @property
    def name(self) -> str: ...

    def spin(self, turns: int) -> int: ...


class Gear:
    def __init__(self, teeth: int = 12, name: str = "gear") -> None:
        self.teeth = teeth
        self.name = name

    def spin(self, turns: int) -> int:
        return turns * self.teeth


class Annotated:
    name: str  # a protocol attribute declared on the class, set per instance

    def __init__(self) -> None:
        self.name = "annotated"

    def spin(self, turns: int) -> int:
        return turns


@attrs.define
class AttrsWidget:
    name: str = "attrs"

    def spin(self, turns: int) -> int:
        return -turns


class Wheel:  # has spin but no name
    def spin(self, turns: int) -> int:
        return turns


class Nameplate:  # has name but no spin
    name = "nameplate"


def new_registry(**kwargs: str) -> Registry[Widget]:
    return Registry[Widget]("widget", protocol=Widget, **kwargs)


def test_a_registered_factory_is_built_with_its_init_params() -> None:
    registry = new_registry()
    registry.register("gear", Gear, description="a toothed wheel", teeth=30)

    widget = registry.get("gear")

    assert isinstance(widget, Gear)
    assert widget.spin(2) == 60
    entry = registry.entry("gear")
    assert (entry.name, entry.factory, entry.description) == ("gear", Gear, "a toothed wheel")
    assert dict(entry.init_params) == {"teeth": 30}
    assert entry.source == "<runtime>"


def test_get_overrides_and_adds_init_params() -> None:
    registry = new_registry()
    registry.register("gear", Gear, teeth=30)

    widget = registry.get("gear", teeth=5, name="small")

    assert isinstance(widget, Gear)
    assert (widget.teeth, widget.name) == (5, "small")


def test_the_same_factory_can_be_registered_under_several_names() -> None:
    registry = new_registry()
    registry.register("gear", Gear)
    registry.register("big_gear", Gear, teeth=100)

    assert registry.available() == ["big_gear", "gear"]
    assert list(registry) == ["big_gear", "gear"]
    assert len(registry) == 2


names = st.from_regex(r"[A-Za-z0-9_.\-]{1,12}", fullmatch=True)


@given(name=names, data=st.data())
def test_names_are_found_in_any_case_and_padding(name: str, data: st.DataObject) -> None:
    registry = new_registry()
    registry.register(name, Gear)
    variant = data.draw(st.sampled_from([name.upper(), name.lower(), f"  {name}\t"]))

    assert variant in registry
    assert registry.entry(variant).name == name.strip().lower()
    assert registry.available() == [name.lower()]


@given(registered=st.lists(names, unique_by=str.lower, max_size=6))
def test_register_then_remove_leaves_nothing(registered: list[str]) -> None:
    registry = new_registry()
    for name in registered:
        registry.register(name, Gear)
    assert registry.available() == sorted(name.lower() for name in registered)

    for name in registered:
        registry.remove(name.upper())

    assert registry.available() == []


def test_a_taken_name_needs_override() -> None:
    registry = new_registry()
    registry.register("gear", Gear, description="the first")

    with pytest.raises(ConfigurationError, match=r"'gear' is already registered.*the first"):
        registry.register("GEAR", AttrsWidget)
    registry.register("GEAR", AttrsWidget, override=True)

    assert registry.entry("gear").factory is AttrsWidget


def test_an_unknown_name_lists_the_names_and_suggests_the_closest() -> None:
    registry = new_registry()
    registry.register("gear", Gear)
    registry.register("attrs_widget", AttrsWidget)

    with pytest.raises(ConfigurationError) as caught:
        registry.get("geer")

    assert caught.value.suggestion == "gear"
    assert caught.value.choices == ("attrs_widget", "gear")
    assert "no widget named 'geer'" in str(caught.value)


@pytest.mark.parametrize("name", ["", "   ", None, 3, "my strategy", "ddp/spawn", "\u0131"])
def test_a_name_must_be_a_non_empty_ascii_word(name: object) -> None:
    registry = new_registry()
    with pytest.raises(ConfigurationError, match="non-empty string of ASCII letters"):
        registry.register(name, Gear)  # type: ignore[call-overload]
    assert name not in registry


def test_removing_an_unknown_name_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="no widget named 'gear'"):
        new_registry().remove("gear")


def test_contains_is_false_for_non_strings() -> None:
    registry = new_registry()
    registry.register("gear", Gear)

    assert 3 not in registry
    assert "wheel" not in registry


@pytest.mark.parametrize("factory", [Gear, Annotated, AttrsWidget])
def test_classes_meeting_the_protocol_are_accepted(factory: type[Widget]) -> None:
    registry = new_registry()
    registry.register("w", factory)

    assert isinstance(registry.get("w"), Widget)


def test_a_class_missing_protocol_methods_is_rejected_at_registration_naming_them() -> None:
    with pytest.raises(
        ConfigurationError, match=r"does not implement the Widget protocol \(missing: spin\)"
    ):
        new_registry().register("nameplate", Nameplate)


def test_a_class_missing_a_data_member_is_rejected_when_it_builds() -> None:
    registry = new_registry()
    registry.register("wheel", Wheel)

    with pytest.raises(
        ConfigurationError, match=r"built a Wheel, which is not a Widget: it lacks name"
    ):
        registry.get("wheel")


def test_a_function_factory_is_checked_when_it_builds() -> None:
    registry = new_registry()

    def make_wheel() -> Wheel:
        return Wheel()

    registry.register("wheel", make_wheel)

    with pytest.raises(
        ConfigurationError, match=r"built a Wheel, which is not a Widget: it lacks name"
    ):
        registry.get("wheel")


def test_a_factory_must_be_callable() -> None:
    with pytest.raises(ConfigurationError, match="must be callable, got int"):
        new_registry().register("seven", 7)  # type: ignore[call-overload]


def test_init_params_the_factory_does_not_take_are_rejected_at_registration() -> None:
    with pytest.raises(
        ConfigurationError, match=r"registered with the option spokes=, which its factory does not"
    ):
        new_registry().register("gear", Gear, spokes=4)


def test_a_misspelt_option_is_refused_with_the_closest_one_at_registration_and_at_get() -> None:
    registry = new_registry()
    with pytest.raises(ConfigurationError, match=r"registered with the option tooth=") as error:
        registry.register("gear", Gear, tooth=4)
    assert error.value.suggestion == "teeth"
    registry.register("gear", Gear)

    with pytest.raises(ConfigurationError, match=r"given the option tooth=") as error:
        registry.get("gear", tooth=4)

    assert error.value.suggestion == "teeth"
    assert "teeth" in error.value.choices
    assert "write teeth= for tooth=" in str(error.value)
    assert registry.get("gear", teeth=4).spin(1) == 4


def test_a_registry_without_a_protocol_checks_nothing_structural() -> None:
    registry = Registry[object]("thing", protocol=object)
    registry.register("anything", object)

    assert type(registry.get("anything")) is object


def test_a_missing_providing_distribution_is_named_with_the_install_command() -> None:
    registry = new_registry(distribution="plait-no-such-distribution")

    with pytest.raises(MissingDependencyError, match="pip install 'plait-no-such-distribution'"):
        registry.get("gear")


# Entry points: a real distribution written to a directory on sys.path.


def install_distribution(
    site: Path, monkeypatch: pytest.MonkeyPatch, group: str, hooks: dict[str, str], module: str
) -> str:
    """Write a distribution with a module and entry points; return its name."""
    name = f"widgets-{uuid.uuid4().hex[:8]}"
    dist_info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = [f"[{group}]", *(f"{ep} = {target}" for ep, target in hooks.items())]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    module_name = next(iter(hooks.values())).split(":")[0]
    (site / f"{module_name}.py").write_text(textwrap.dedent(module))
    monkeypatch.syspath_prepend(str(site))
    return name


def unique_group() -> str:
    return f"plait.test_widgets_{uuid.uuid4().hex[:8]}"


PLUGIN = """
    class Cog:
        name = "cog"

        def __init__(self, size=1):
            self.size = size

        def spin(self, turns):
            return turns * self.size

    def register(registry):
        registry.register("cog", Cog, description="a small cog")
        registry.register("big_cog", Cog, description="a big cog", size=10)
"""


def test_entry_points_are_loaded_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = unique_group()
    module = f"widgets_{uuid.uuid4().hex[:8]}"
    distribution = install_distribution(
        tmp_path, monkeypatch, group, {"cogs": f"{module}:register"}, PLUGIN
    )
    registry = new_registry(entry_point_group=group)

    assert registry.available() == ["big_cog", "cog"]
    assert registry.get("big_cog").spin(2) == 20
    assert registry.entry("cog").source == distribution


def test_a_runtime_registration_after_entry_points_needs_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = unique_group()
    module = f"widgets_{uuid.uuid4().hex[:8]}"
    install_distribution(tmp_path, monkeypatch, group, {"cogs": f"{module}:register"}, PLUGIN)
    registry = new_registry(entry_point_group=group)

    with pytest.raises(ConfigurationError, match="'cog' is already registered"):
        registry.register("cog", Gear)


@pytest.mark.parametrize(
    ("target", "module_source", "message"),
    [
        ("missing_attr", "x = 1\n", "failed to load: AttributeError"),
        ("not_callable", "not_callable = 42\n", "is not a registration hook"),
        (
            "broken",
            "def broken(registry):\n    raise RuntimeError('oops')\n",
            "raised RuntimeError: oops",
        ),
    ],
)
def test_a_broken_entry_point_is_reported_naming_its_distribution(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    module_source: str,
    message: str,
) -> None:
    group = unique_group()
    module = f"widgets_{uuid.uuid4().hex[:8]}"
    distribution = install_distribution(
        tmp_path, monkeypatch, group, {"bad": f"{module}:{target}"}, module_source
    )
    registry = new_registry(entry_point_group=group)

    with pytest.raises(ConfigurationError, match=message) as caught:
        registry.available()
    with pytest.raises(ConfigurationError, match=message):
        registry.get("anything")  # still broken: never skipped silently

    assert distribution in str(caught.value)
    assert distribution in (caught.value.fix or "")


def test_two_distributions_claiming_one_name_are_both_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = unique_group()
    first = install_distribution(
        tmp_path / "a",
        monkeypatch,
        group,
        {"a": f"widgets_{uuid.uuid4().hex[:8]}:register"},
        PLUGIN,
    )
    second = install_distribution(
        tmp_path / "b",
        monkeypatch,
        group,
        {"b": f"widgets_{uuid.uuid4().hex[:8]}:register"},
        PLUGIN,
    )
    registry = new_registry(entry_point_group=group)

    with pytest.raises(ConfigurationError, match="is already registered") as caught:
        registry.available()

    assert first in str(caught.value)
    assert second in str(caught.value)


class Broken:  # lacks spin
    name = "broken"


def test_a_factory_registered_by_reference_is_imported_and_checked_when_first_asked_for() -> None:
    registry = Registry[Widget]("widget", protocol=Widget)
    registry.register_lazily("gear", f"{__name__}:Gear", description="a toothed wheel", teeth=3)
    entry = registry.entry("gear")
    assert entry.reference == f"{__name__}:Gear"
    assert "gear" in registry
    assert registry.available() == ["gear"]
    assert entry.factory is Gear  # imported now, and the same for every lookup
    assert registry.get("gear").spin(2) == 6
    assert registry.entry("gear").factory is Gear


def test_a_reference_is_checked_as_a_factory_is_when_it_is_imported() -> None:
    registry = Registry[Widget]("widget", protocol=Widget)
    registry.register_lazily("broken", f"{__name__}:Broken")
    registry.register_lazily("gear", f"{__name__}:Gear", gears=3)
    with pytest.raises(ConfigurationError, match="missing: spin"):
        registry.get("broken")
    with pytest.raises(ConfigurationError, match=r"the option gears=, which its factory"):
        registry.get("gear")


def test_a_reference_that_names_nothing_importable_says_so_when_first_used() -> None:
    registry = Registry[Widget]("widget", protocol=Widget)
    with pytest.raises(ConfigurationError, match=r"is not 'package\.module:attribute'"):
        registry.register_lazily("gear", "no colon here")
    registry.register_lazily("ghost", "plait_no_such_module:Gear")
    registry.register_lazily("absent", f"{__name__}:Absent")
    assert registry.available() == ["absent", "ghost"]  # listed without importing
    with pytest.raises(ConfigurationError, match=r"'ghost' is registered as .*ModuleNotFoundError"):
        registry.get("ghost")
    with pytest.raises(ConfigurationError, match=r"'absent' is registered as .*AttributeError"):
        registry.entry("absent").factory  # noqa: B018 - asking for it imports it
    with pytest.raises(ConfigurationError, match=r"already registered .*plait_no_such_module:Gear"):
        registry.register_lazily("ghost", f"{__name__}:Gear")
