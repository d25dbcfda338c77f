"""Hosts for multi-node tests: Linux network namespaces joined by one bridge.

Each host is a network namespace with loopback and one interface, ``eth0``, whose
address is on a private subnet; the bridge lives in a namespace of its own, so
that nothing of the machine's own network is touched or reachable. A process run
in a host (`Host.command`) sees only that host's addresses. Making namespaces
needs root (``CAP_SYS_ADMIN``) and iproute2; `unavailable` says why they cannot be
made where they cannot.
"""

from __future__ import annotations

import gc

# Until the imports are done, no cycle collection: torch's import makes a million
# objects, and every full collection over them costs this process most of a second.
gc.disable()

import contextlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence

import attrs

# What the imports made lives as long as the process: the collector never scans it again.
gc.freeze()
gc.enable()

SUBNET = "10.77.0"
"""The hosts' subnet (a /24): host ``i`` is ``10.77.0.(i + 1)``. Each set of hosts
has its own bridge, so sets made at once by parallel tests never meet."""


def _ip(*arguments: str) -> None:
    subprocess.run(["ip", *arguments], check=True, capture_output=True, text=True, timeout=30)


@attrs.frozen
class Host:
    """One host: a network namespace and its address."""

    namespace: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def bytes_received(self) -> int:
        """What ``eth0`` received so far: traffic from the other hosts only."""
        shown = subprocess.run(
            ["ip", "-n", self.namespace, "-s", "-j", "link", "show", "eth0"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
        received: int = json.loads(shown.stdout)[0]["stats64"]["rx"]["bytes"]
        return received


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or ``None`` if they can."""
    if shutil.which("ip") is None:
        return "needs iproute2's ip command to make network namespaces"
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    probe = f"plait-probe-{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", probe)
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        return f"cannot make a network namespace here: {detail.strip()}"
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        _ip("netns", "del", probe)
    return None


@contextlib.contextmanager
def hosts(count: int) -> Iterator[list[Host]]:
    """Make ``count`` hosts on one bridge; delete them (and the bridge) afterwards.

    The processes started in them must have ended by then.
    """
    token = uuid.uuid4().hex[:8]
    switch = f"plait-{token}-sw"
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        result = []
        for index in range(count):
            namespace = f"plait-{token}-h{index}"
            _ip("netns", "add", namespace)
            made.append(namespace)
            port = f"h{index}"
            _ip("link", "add", "name", "eth0", "netns", namespace, "type", "veth",
                "peer", "name", port, "netns", switch)  # fmt: skip
            _ip("-n", switch, "link", "set", port, "master", "br0")
            _ip("-n", switch, "link", "set", port, "up")
            address = f"{SUBNET}.{index + 1}"
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            result.append(Host(namespace, address))
        yield result
    finally:
        for namespace in reversed(made):
            with contextlib.suppress(OSError, subprocess.CalledProcessError):
                _ip("netns", "del", namespace)
