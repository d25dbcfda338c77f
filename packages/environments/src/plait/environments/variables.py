"""Reading scheduler variables, with errors that name the variable."""

from __future__ import annotations

import re
from collections.abc import Mapping

from plait.core import ConfigurationError

__all__ = [
    "all_present",
    "expand_hostlist",
    "job_port",
    "read_int",
    "read_port",
    "require",
]


def all_present(environ: Mapping[str, str], variables: tuple[str, ...]) -> dict[str, str] | None:
    """The values of ``variables`` if every one is set, else ``None``."""
    if not all(variable in environ for variable in variables):
        return None
    return {variable: environ[variable] for variable in variables}


def require(environ: Mapping[str, str], variable: str, *, environment: str) -> str:
    """The value of ``variable``, which ``environment`` always sets.

    Raises:
        ConfigurationError: It is not set.
    """
    value = environ.get(variable)
    if value is None:
        raise ConfigurationError(
            f"{environment}: the variable {variable} is not set, but the scheduler always sets it",
            value=variable,
            fix=f"run under the scheduler that sets {variable}, or choose another "
            "environment with PLAIT_CLUSTER_ENVIRONMENT",
        )
    return value


def read_int(
    environ: Mapping[str, str],
    variable: str,
    *,
    environment: str,
    default: int | None = None,
    minimum: int = 0,
) -> int:
    """Parse ``variable`` as an integer of at least ``minimum``.

    Raises:
        ConfigurationError: It is missing (and there is no default), not an integer,
            or below ``minimum``.
    """
    if variable not in environ and default is not None:
        return default
    text = require(environ, variable, environment=environment)
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"{environment}: the variable {variable}={text!r} is not an integer",
            value=text,
            fix=f"set {variable} to an integer of at least {minimum}, or unset it",
        ) from None
    if value < minimum:
        raise ConfigurationError(
            f"{environment}: the variable {variable}={value} is below {minimum}",
            value=value,
            fix=f"set {variable} to an integer of at least {minimum}",
        )
    return value


def read_port(environ: Mapping[str, str], variable: str, *, environment: str) -> int:
    """Parse ``variable`` as a TCP port.

    Raises:
        ConfigurationError: It is not an integer in 1..65535.
    """
    port = read_int(environ, variable, environment=environment, minimum=1)
    if port > 65535:
        raise ConfigurationError(
            f"{environment}: the variable {variable}={port} is not a port (1 to 65535)",
            value=port,
            fix=f"set {variable} to a free port, e.g. 29500",
        )
    return port


def job_port(
    environ: Mapping[str, str],
    job_id: int,
    *,
    environment: str,
    base: int = 15000,
    spread: int = 10000,
) -> int:
    """``MASTER_PORT`` if set, else ``base + job_id % spread``: every task derives it alike.

    SLURM's default (``15000 + id % 10000``) and LSF's (``10000 + id % 1000``) are
    the ports Lightning derives for them.
    """
    if "MASTER_PORT" in environ:
        return read_port(environ, "MASTER_PORT", environment=environment)
    return base + job_id % spread


_GROUP = re.compile(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)")


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM host list: ``"node[01-03,7],gpu1"`` is node01, node02, node03, node7, gpu1.

    Hosts may be separated by spaces too (``"alpha beta"``), and a range list may
    hold spaces (``"1.2.3.[089, 100-110]"``), as SLURM accepts them.

    Raises:
        ConfigurationError: It is malformed (unbalanced brackets, an empty list).
    """
    hosts: list[str] = []
    text = _commas_between_hosts(hostlist)
    position = 0
    while position < len(text):
        match = _GROUP.match(text, position)
        if match is None or match.end() == position:
            break
        prefix, ranges, suffix = match.groups()
        if ranges is None:
            hosts.append(prefix + suffix)
        else:
            for part in ranges.split(","):
                start, _, stop = part.partition("-")
                if not start.isdigit() or (stop and not stop.isdigit()):
                    raise _bad_hostlist(hostlist)
                width = len(start)
                hosts.extend(
                    f"{prefix}{number:0{width}d}{suffix}"
                    for number in range(int(start), int(stop or start) + 1)
                )
        position = match.end() + 1  # past the comma between groups
    if not hosts or any(not host for host in hosts) or text.count("[") != text.count("]"):
        raise _bad_hostlist(hostlist)
    return hosts


def _commas_between_hosts(hostlist: str) -> str:
    """``hostlist`` with spaces between hosts made commas and spaces in brackets dropped."""
    out: list[str] = []
    depth = 0
    for character in hostlist.strip():
        if character == "[":
            depth += 1
        elif character == "]":
            depth -= 1
        if character.isspace():
            if depth == 0 and out and out[-1] != ",":
                out.append(",")
            continue
        if character == "," and depth == 0 and out and out[-1] == ",":
            continue  # "a , b": one separator
        out.append(character)
    return "".join(out)


def _bad_hostlist(hostlist: str) -> ConfigurationError:
    return ConfigurationError(
        f"SLURM: the host list {hostlist!r} is malformed",
        value=hostlist,
        fix="set MASTER_ADDR to the host of rank 0 to skip reading the host list",
    )
