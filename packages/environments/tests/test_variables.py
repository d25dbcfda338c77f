import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.core import ConfigurationError, free_port
from plait.environments import expand_hostlist


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu-[017-018]", ["gpu-017", "gpu-018"]),
        ("node[01-02,7],gpu5", ["node01", "node02", "node7", "gpu5"]),
        ("a[1-2]-ib", ["a1-ib", "a2-ib"]),
        ("x,y", ["x", "y"]),
        # Spaces between hosts and inside a range list, as SLURM accepts them.
        ("alpha beta gamma", ["alpha", "beta", "gamma"]),
        ("1.2.3.[089, 100-102]", ["1.2.3.089", "1.2.3.100", "1.2.3.101", "1.2.3.102"]),
        ("a[1-2] b , c", ["a1", "a2", "b", "c"]),
    ],
)
def test_slurm_host_lists_expand(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@given(
    prefix=st.from_regex(r"[a-z][a-z\-]{0,6}", fullmatch=True),
    start=st.integers(0, 500),
    length=st.integers(1, 20),
    width=st.integers(1, 4),
)
def test_a_range_expands_to_every_host_in_order(
    prefix: str, start: int, length: int, width: int
) -> None:
    stop = start + length - 1
    hosts = expand_hostlist(f"{prefix}[{start:0{width}d}-{stop:0{width}d}]")

    assert hosts == [f"{prefix}{n:0{width}d}" for n in range(start, stop + 1)]


@pytest.mark.parametrize("hostlist", ["", "node[1-", "node[a-b]", "node[1-2]]", ","])
def test_a_malformed_host_list_is_an_error(hostlist: str) -> None:
    with pytest.raises(ConfigurationError, match="is malformed"):
        expand_hostlist(hostlist)


def test_a_free_port_can_be_bound_on_loopback() -> None:
    port = free_port()

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))
