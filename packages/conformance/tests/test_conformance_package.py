import importlib.metadata

import plait.conformance


def test_the_suite_registers_no_pytest_plugin_before_it_has_properties() -> None:
    plugins = importlib.metadata.entry_points(group="pytest11")

    assert plait.conformance.__doc__
    assert [plugin.name for plugin in plugins if plugin.value.startswith("plait.conformance")] == []
