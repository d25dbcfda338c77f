"""Choosing gloo's interface: only where its default would advertise loopback to other hosts."""

import os
import socket

import pytest

from plait.strategies import network
from plait.strategies.network import GLOO_INTERFACE_VARIABLE, choose_gloo_interface, gloo_interface


@pytest.fixture
def loopback_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """This host's name resolves to loopback, as in containers sharing a host name."""
    # A copy of the variables: what the code sets must not outlive the test.
    kept = {key: value for key, value in os.environ.items() if key != GLOO_INTERFACE_VARIABLE}
    monkeypatch.setattr(os, "environ", kept)
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")


def test_a_rendezvous_on_loopback_keeps_gloos_default(loopback_host_name: None) -> None:
    assert gloo_interface("127.0.0.1", 29500) is None


def test_a_host_name_other_hosts_can_reach_keeps_gloos_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(GLOO_INTERFACE_VARIABLE, raising=False)
    monkeypatch.setattr(network, "_resolve", lambda name: "10.1.2.3")

    assert gloo_interface("10.1.2.4", 29500) is None


def test_the_users_own_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GLOO_INTERFACE_VARIABLE, "ib0")
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")

    assert choose_gloo_interface("10.1.2.4", 29500) is None
    assert os.environ[GLOO_INTERFACE_VARIABLE] == "ib0"


def test_the_interface_that_routes_to_the_rendezvous_is_set(
    loopback_host_name: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(network, "_route_to", lambda address, port: "10.1.2.3")
    monkeypatch.setattr(network, "_interface_with", lambda address: "eth7")

    assert choose_gloo_interface("10.1.2.4", 29500) == "eth7"
    assert os.environ[GLOO_INTERFACE_VARIABLE] == "eth7"


def test_loopbacks_address_is_found_on_its_interface() -> None:
    # The lookup itself, on the one interface every Linux machine has.
    if network._interface_with("127.0.0.1") is None:
        pytest.skip("reads interface addresses on Linux only")
    assert network._interface_with("127.0.0.1") == "lo"
