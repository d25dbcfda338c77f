"""Which network interface gloo uses, where its own default cannot reach the other hosts.

Gloo binds the address its host's name resolves to. Where that name resolves to
loopback (containers or network namespaces that share a host name, many cloud
images), every rank tells the others to reach it at ``127.0.0.1``, and a job that
spans hosts fails after gloo's retries with ``Connection refused`` from loopback.
Only there, and only when ``GLOO_SOCKET_IFNAME`` is not set, plait sets it to the
interface this host uses to reach the job's rendezvous.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import socket
import struct
import sys
from typing import Final

__all__ = ["GLOO_INTERFACE_VARIABLE", "choose_gloo_interface", "gloo_interface"]

GLOO_INTERFACE_VARIABLE: Final = "GLOO_SOCKET_IFNAME"
"""gloo's own setting: the interface (or comma-separated interfaces) it binds."""

_SIOCGIFADDR: Final = 0x8915  # Linux: an interface's IPv4 address
_LOG = logging.getLogger("plait.strategies")


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def _resolve(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def _route_to(address: str, port: int) -> str | None:
    # The local address the kernel would send from: a UDP "connection" sends nothing.
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, port))
        local: str = probe.getsockname()[0]
        return local
    return None


def _interface_with(address: str) -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None


def gloo_interface(main_address: str, main_port: int) -> str | None:
    """The interface gloo must bind for a job whose rendezvous is at ``main_address``.

    ``None`` when gloo's default serves: ``GLOO_SOCKET_IFNAME`` is set, this host's
    name resolves to an address other hosts can reach, the rendezvous is on
    loopback (a job on one machine), or no interface is found (IPv6, or outside
    Linux).
    """
    if os.environ.get(GLOO_INTERFACE_VARIABLE):
        return None
    own = _resolve(socket.gethostname())
    if own is not None and not _is_loopback(own):
        return None
    main = _resolve(main_address)
    if main is None or _is_loopback(main):
        return None
    local = _route_to(main, main_port)
    if local is None or _is_loopback(local):
        return None
    return _interface_with(local)


def choose_gloo_interface(main_address: str, main_port: int) -> str | None:
    """Set ``GLOO_SOCKET_IFNAME`` for this process where gloo's default cannot work.

    Returns:
        The interface chosen, or ``None`` if nothing was changed (see `gloo_interface`).
    """
    interface = gloo_interface(main_address, main_port)
    if interface is not None:
        os.environ[GLOO_INTERFACE_VARIABLE] = interface
        _LOG.info(
            "plait: %s=%s: this host's name resolves to loopback, and %s reaches the "
            "rendezvous at %s",
            GLOO_INTERFACE_VARIABLE,
            interface,
            interface,
            main_address,
        )
    return interface
