"""Finding a rendezvous port, and holding one from the moment it is chosen."""

from __future__ import annotations

import socket

__all__ = ["free_port", "listening_socket", "release_reserved", "reserve_port", "take_reserved"]

_reserved: dict[int, socket.socket] = {}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now, chosen by the operating system.

    The port is free when the probe closes, not after: another program may bind it
    before the caller does. Where the caller serves the port itself, bind it once
    with `listening_socket` and hand the socket over instead.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def listening_socket(
    address: str, port: int | None = None, *, every_interface: bool = False
) -> socket.socket:
    """A TCP socket bound to ``address`` and listening, on ``port`` or a free one.

    With ``every_interface``, it listens on every interface of ``address``'s family
    (as a ``TCPStore`` serving its own port does), so that other hosts reach it
    whichever of this host's addresses they know it by.

    The port is the caller's from the first moment: no other program can take it
    between choosing and serving. Hand it to a ``torch.distributed.TCPStore`` with
    ``master_listen_fd=sock.detach()`` (its port is ``sock.getsockname()[1]``);
    clients that connect before the store serves wait in the backlog.

    Raises:
        OSError: ``address`` is not an address of this machine, or ``port`` is held.
    """
    family, kind, protocol, _, where = socket.getaddrinfo(
        address, port or 0, type=socket.SOCK_STREAM
    )[0]
    if every_interface:
        where = ("::", *where[1:]) if family == socket.AF_INET6 else ("0.0.0.0", where[1])
    listener = socket.socket(family, kind, protocol)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(where)
        listener.listen(socket.SOMAXCONN)
    except OSError:
        listener.close()
        raise
    return listener


def reserve_port(address: str = "127.0.0.1", *, every_interface: bool = False) -> int:
    """A free port on ``address``, held by this process until `take_reserved` hands it over.

    For a port this process will serve later (rank 0's store, which the launcher
    names to the other ranks before rank 0 starts it): between choosing and serving,
    no other program can take it, and clients that connect early wait in its backlog.
    ``every_interface`` is `listening_socket`'s.

    Raises:
        OSError: ``address`` is not an address of this machine.
    """
    listener = listening_socket(address, every_interface=every_interface)
    port = int(listener.getsockname()[1])
    _reserved[port] = listener
    return port


def take_reserved(port: int) -> socket.socket | None:
    """The listening socket `reserve_port` holds for ``port``, now the caller's; else ``None``."""
    return _reserved.pop(port, None)


def release_reserved(port: int) -> None:
    """Close the socket `reserve_port` still holds for ``port``: no store came to serve it."""
    listener = _reserved.pop(port, None)
    if listener is not None:
        listener.close()
